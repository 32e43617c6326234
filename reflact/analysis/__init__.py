"""Analysis: when two kept items are the same change (matching, guards, embedding, judge,
matchers) and what that says of a run: agreement, redundancy, distinct items (figures)."""
