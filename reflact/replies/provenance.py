"""Which trajectories each item stands on (`reflect.provenance`).

The analyst names, per item, the trajectories that motivate it by their position in the call
(`supporting_trajectories`, 1-based, as numbered in the headings). reflact checks every position
against the trajectories shown in that call (a number out of range is a schema error, asked
again like any other) and records the ids they stand for beside it (`supporting_ids`), so the
saved patch says which runs each item rests on whatever part of a split minibatch it came from.
Per run: how many kept items name at least one trajectory, and which shown trajectories no kept
item names.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from reflact.core.modes import SUPPORT_FIELD, SUPPORT_IDS_FIELD, Mode
from reflact.replies.patches import CheckedReply, ReplyError


def with_support_ids(checked: CheckedReply, mode: Mode, ids: list[str]) -> CheckedReply:
    """The checked reply with `supporting_ids` on each kept item; a ReplyError (asked again) for a
    position that is not one of the `ids` shown in this call."""
    key = mode.payload_key
    items = [
        _item_support(item, f"patch.{key}[{index}].{SUPPORT_FIELD}", ids)
        for index, item in enumerate(checked.obj["patch"][key])
    ]
    return replace(checked, obj={**checked.obj, "patch": {**checked.obj["patch"], key: items}})


def _item_support(item: dict, where: str, ids: list[str]) -> dict:
    raw = item.get(SUPPORT_FIELD)
    raw = [] if raw is None else [raw] if isinstance(raw, (int, str)) and not isinstance(raw, bool) else raw
    if not isinstance(raw, list):
        raise ReplyError(f"{where} must be a list of trajectory numbers (1 to {len(ids)})")
    chosen: list[str] = []
    for value in raw:
        position = _position(value, ids)
        if position is None:
            raise ReplyError(
                f"{where}: {str(value)[:40]!r} is not a trajectory number; use the numbers 1 to "
                f"{len(ids)} of the headings 'Trajectory i of {len(ids)}'"
            )
        if not 1 <= position <= len(ids):
            raise ReplyError(f"{where}: {position} is out of range; this batch has trajectories 1 to {len(ids)}")
        if ids[position - 1] not in chosen:
            chosen.append(ids[position - 1])
    return {**item, SUPPORT_IDS_FIELD: chosen}


def _position(value: object, ids: list[str]) -> int | None:
    """A 1-based position from a number, a string of digits, or (a common slip) an id shown. A
    number and its digits are one value (1 and "1" name the same trajectory, whatever the ids
    look like): a position when in range, else the shown id it spells, else out of range."""
    if isinstance(value, bool):
        return None
    number: int | None = None
    if isinstance(value, int):
        number, text = value, str(value)
    elif isinstance(value, float) and value.is_integer():
        number, text = int(value), str(int(value))
    elif isinstance(value, str):
        text = value.strip()
        number = int(text) if text.isascii() and text.isdigit() else None
    else:
        return None
    if number is not None and 1 <= number <= len(ids):
        return number
    if text in ids:
        return ids.index(text) + 1
    return number


@dataclass
class SupportTally:
    """The run's provenance figures, gathered patch by patch (one pass, flat memory)."""

    kept: int = 0
    supported: int = 0
    shown: set[str] = field(default_factory=set)  # trajectories shown in calls that made a patch
    named: set[str] = field(default_factory=set)  # trajectories some kept item stands on

    def add(self, shown_ids: list[str], items: list) -> None:
        self.shown.update(shown_ids)
        for item in items:
            support = item.get(SUPPORT_IDS_FIELD) if isinstance(item, dict) else None
            self.kept += 1
            if support:
                self.supported += 1
                self.named.update(support)

    def unused(self) -> list[str]:
        """The shown trajectories no kept item stands on, sorted."""
        return sorted(self.shown - self.named)

    def counts(self) -> dict:
        return {
            "edits_supported": self.supported,
            "support_share": round(self.supported / self.kept, 6) if self.kept else 0.0,
            "trajectories_unused": len(self.shown - self.named),
        }
