"""What a saved patch would do to the skill (SPEC 5): the candidate skill, its diff, each edit's status.

Patch mode applies a minibatch's kept edits to the current skill and records every edit's
status; full-rewrite mode diffs the candidate skill. Rewrite-from-suggestions has no text to
apply (an editor model turns the suggestions into a skill later), so it gets no preview.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from reflact.core.files import write_text
from reflact.core.modes import Mode
from reflact.replies.apply import apply_counts, apply_edits, unified_diff
from reflact.running.rundir import RunDir

APPLY_COUNTS = ("applied", "fallback", "skipped", "total")


@dataclass
class Preview:
    tag: str
    statuses: list[dict] = field(default_factory=list)  # per edit: index, op, status, reason
    counts: dict = field(default_factory=dict)  # applied, fallback, skipped, total, apply_share


def candidate(skill: str, patch: dict, mode: Mode, tag: str) -> tuple[str, Preview] | None:
    """(the candidate skill, its preview), or None when the mode has no text to apply."""
    items = (patch.get("patch") or {}).get(mode.payload_key) or []
    if mode.name == "patch":
        text, statuses = apply_edits(skill, items)
        return text, Preview(tag, [asdict(s) for s in statuses], apply_counts(statuses))
    if mode.full_rewrite and items:
        return str(items[0].get("new_skill", "")), Preview(tag)
    return None


def write_preview(run_dir: RunDir, skill: str, patch: dict, mode: Mode, tag: str) -> Preview | None:
    made = candidate(skill, patch, mode, tag)
    if made is None:
        return None
    text, preview = made
    skill_path, diff_path = run_dir.preview_paths(tag)
    write_text(skill_path, text)
    write_text(diff_path, unified_diff(skill, text, "skill.md") or "(no change)\n")
    return preview


def run_apply_counts(previews: dict[str, Preview]) -> dict:
    """Run totals; `apply_share` is the share of kept edits that would apply (or fall back)."""
    totals = {key: sum(p.counts.get(key, 0) for p in previews.values()) for key in APPLY_COUNTS}
    totals["apply_share"] = (totals["applied"] + totals["fallback"]) / totals["total"] if totals["total"] else 0.0
    return totals
