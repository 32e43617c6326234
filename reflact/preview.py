"""What the saved patches would do to the skill (SPEC 5): candidate skills, diffs, apply status.

Patch mode applies each minibatch's kept edits to the current skill and records every edit's
status; full-rewrite mode diffs each candidate skill. Rewrite-from-suggestions has no text to
apply (an editor model turns the suggestions into a skill later), so it gets no preview.
Written under `preview/` in the run dir; the counts go into the summary and MLflow.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from reflact.apply import apply_counts, apply_edits, unified_diff
from reflact.files import read_json, write_text
from reflact.modes import Mode


@dataclass
class Preview:
    tag: str
    statuses: list[dict] = field(default_factory=list)  # per edit: index, op, status, reason
    counts: dict = field(default_factory=dict)  # applied, fallback, skipped, total, apply_share


def preview_patch(skill: str, patch: dict, mode: Mode, tag: str, out_dir: Path) -> Preview | None:
    items = (patch.get("patch") or {}).get(mode.payload_key) or []
    if mode.name == "patch":
        candidate, statuses = apply_edits(skill, items)
        result = Preview(tag, [asdict(s) for s in statuses], apply_counts(statuses))
    elif mode.full_rewrite and items:
        candidate = str(items[0].get("new_skill", ""))
        result = Preview(tag)
    else:
        return None
    write_text(out_dir / f"{tag}.skill.md", candidate)
    write_text(out_dir / f"{tag}.diff", unified_diff(skill, candidate, "skill.md") or "(no change)\n")
    return result


def preview_run(run_dir: Path, skill: str, mode: Mode, tags: list[str]) -> dict[str, Preview]:
    """Previews of every saved patch among `tags` (minibatches without a patch are left out)."""
    previews = {}
    for tag in tags:
        patch = read_json(run_dir / "patches" / f"{tag}.json")
        if isinstance(patch, dict):
            result = preview_patch(skill, patch, mode, tag, run_dir / "preview")
            if result is not None:
                previews[tag] = result
    return previews


def run_apply_counts(previews: dict[str, Preview]) -> dict:
    """Run totals; `apply_share` is the share of kept edits that would apply (or fall back)."""
    totals = {key: sum(p.counts.get(key, 0) for p in previews.values()) for key in
              ("applied", "fallback", "skipped", "total")}
    totals["apply_share"] = (totals["applied"] + totals["fallback"]) / totals["total"] if totals["total"] else 0.0
    return totals
