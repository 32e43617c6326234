"""reflact's patch as SkillOpt 0.2.0's reflect writes it, to the byte.

SkillOpt's `run_error_analyst_minibatch` / `run_success_analyst_minibatch` (skillopt/gradient/reflect.py)
save the model's object with `source_type` set and, when skill-aware reflection is on, `appendix_notes`
set to the notes it extracted, in every update mode (the failure side always, the success side unless the
appendix source is `failure_only`); then `json.dump(..., ensure_ascii=False, indent=2)`, no newline. A
failure reply with notes and no patch becomes its carrier, whatever the mode:
`{"source_type": "failure", "patch": {"reasoning": "execution-lapse only", "edits": []}, "appendix_notes": [...]}`.

reflact's record of the same patch (`<patches_dir>.reflact/patches/`) keeps its own bookkeeping; only
`support_counts=True` puts `batch_size` (the trajectories analysed) into SkillOpt's copy, which
SkillOpt's trainer then reads as each item's support count.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from reflact.core.groups import FAILURE
from reflact.replies.patches import LAPSES_ONLY, normalize_notes

# SkillOpt's own wording and payload key for a lapse-only carrier (reflect.py, run_error_analyst_minibatch)
CARRIER_REASONING = "execution-lapse only"
CARRIER_KEY = "edits"
# what reflact's patch file adds to the model's object besides source_type (running/stage.py, patch_file)
BOOKKEEPING = ("batch_size", "trajectory_ids", "n_analysed", "n_proposed", "fingerprint")


@dataclass(frozen=True)
class Shape:
    """What decides SkillOpt's patch: its skill-aware switch and appendix source, and the opt-in support."""

    skill_aware: bool
    appendix_source: str  # "both" or "failure_only"
    support_counts: bool = False

    def notes_field(self, group: str) -> bool:
        """Does SkillOpt set `appendix_notes` on this group's patches (any update mode)."""
        return self.skill_aware and (group == FAILURE.name or self.appendix_source != "failure_only")


def as_skillopt(patch: dict, shape: Shape) -> dict:
    """The patch SkillOpt's reflect would have saved for the model's same reply."""
    group = patch.get("source_type")
    if _is_carrier(patch):
        return {
            "source_type": group,
            "patch": {"reasoning": CARRIER_REASONING, CARRIER_KEY: []},
            "appendix_notes": normalize_notes(patch.get("appendix_notes")),
        }
    out = {k: v for k, v in patch.items() if k not in BOOKKEEPING}
    if isinstance(group, str) and shape.notes_field(group):
        # in place when the model sent the key, else after source_type, as SkillOpt assigns it
        out["appendix_notes"] = normalize_notes(out.get("appendix_notes"))
    if shape.support_counts and "batch_size" in patch:
        out["batch_size"] = patch["batch_size"]
    return out


def as_text(patch: dict) -> str:
    """The file's text as SkillOpt's `json.dump(patch, f, ensure_ascii=False, indent=2)` writes it."""
    return json.dumps(patch, ensure_ascii=False, indent=2)


def _is_carrier(patch: dict) -> bool:
    """A failure minibatch of execution lapses only: reflact's patch with no items and its own wording."""
    inner = patch.get("patch")
    return (
        patch.get("source_type") == FAILURE.name
        and isinstance(inner, dict)
        and inner.get("reasoning") == LAPSES_ONLY
        and len(inner) == 2
        and not any(v for k, v in inner.items() if k != "reasoning")
    )
