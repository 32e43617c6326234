"""From a parsed reply to a patch: schema validation, the budget cut, appendix notes (SPEC 4)."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from reflact.modes import Mode


class ReplyError(ValueError):
    """The reply's object does not fit the mode's schema; the message is used for the re-ask."""


@dataclass(frozen=True)
class CheckedReply:
    obj: dict  # the model's object, payload cut to the budget, notes normalised
    proposed: int  # items the model proposed, before the cut
    kept: int


def normalize_notes(raw: object) -> list[str]:
    """A list of non-empty strings from a string, a list of strings, or objects with note/content."""
    if raw is None:
        return []
    items = [raw] if isinstance(raw, (str, dict)) else raw if isinstance(raw, list) else []
    notes = []
    for item in items:
        if isinstance(item, dict):
            item = item.get("note") or item.get("content") or ""
        if isinstance(item, str) and item.strip():
            notes.append(item.strip())
    return notes


def cut(items: list, budget: int) -> list:
    """The first L items; L < 0 keeps all, L = 0 none."""
    return list(items) if budget < 0 else list(items[:budget])


def check_reply(obj: dict, mode: Mode, group: str, budget: int, notes_allowed: bool) -> CheckedReply:
    obj = dict(obj)
    notes = normalize_notes(obj.get("appendix_notes")) if notes_allowed else []
    if notes_allowed:
        obj["appendix_notes"] = notes
    patch = obj.get("patch")
    try:
        items = _payload(patch, mode)
    except ReplyError:
        # a failure batch may be all execution lapses: notes and no usable patch
        if group == "failure" and notes:
            obj["patch"] = {"reasoning": "execution lapses only", mode.payload_key: []}
            return CheckedReply(obj=obj, proposed=0, kept=0)
        raise
    if mode.full_rewrite:
        if len(items) != 1:
            raise ReplyError(f"'patch.{mode.payload_key}' must hold exactly one candidate, got {len(items)}")
        kept = items
    else:
        kept = cut(items, budget)
    for index, item in enumerate(kept):
        _check_item(item, index, mode)
    obj["patch"] = {**patch, mode.payload_key: kept}
    return CheckedReply(obj=obj, proposed=len(items), kept=len(kept))


def _payload(patch: object, mode: Mode) -> list:
    key = mode.payload_key
    if not isinstance(patch, dict):
        raise ReplyError("the reply has no 'patch' object")
    if not isinstance(patch.get(key), list):
        raise ReplyError(f"'patch' has no list '{key}' (mode {mode.name})")
    reasoning = patch.get("reasoning", "")
    if not isinstance(reasoning, str):
        raise ReplyError("'patch.reasoning' must be a string")
    return patch[key]


def _check_item(item: object, index: int, mode: Mode) -> None:
    where = f"patch.{mode.payload_key}[{index}]"
    if not isinstance(item, dict):
        raise ReplyError(f"{where} must be an object")
    try:
        mode.item.model_validate(item)
    except ValidationError as exc:
        problems = "; ".join(_describe(err) for err in exc.errors())
        raise ReplyError(f"{where}: {problems}") from None


def _describe(err: dict) -> str:
    field = ".".join(str(part) for part in err.get("loc", ()))
    message = err.get("msg", "invalid").removeprefix("Value error, ")
    return f"{field}: {message}" if field else message


def merge_replies(parts: list[CheckedReply], mode: Mode, budget: int) -> CheckedReply:
    """One patch from the calls of a minibatch that was split to fit the context window:
    summaries and notes joined, items taken in turn from each part, then cut to the budget."""
    key = mode.payload_key
    merged: dict = {"parts": len(parts)}
    for part in parts:
        for field, value in part.obj.items():
            if field == "patch":
                continue
            if isinstance(value, list):
                merged[field] = [*merged.get(field, []), *value]
            else:
                merged.setdefault(field, value)
    lists = [part.obj["patch"][key] for part in parts]
    interleaved = [items[i] for i in range(max(map(len, lists))) for items in lists if i < len(items)]
    kept = cut(interleaved, budget)
    merged["patch"] = {
        "reasoning": "\n\n".join(str(part.obj["patch"].get("reasoning", "")) for part in parts),
        key: kept,
    }
    return CheckedReply(obj=merged, proposed=sum(part.proposed for part in parts), kept=len(kept))
