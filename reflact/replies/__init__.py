"""Replies: a reply's one JSON object (parse), checked and cut to the budget (patches), the
trajectories behind each item (provenance), and what a patch would do to the skill (apply)."""
