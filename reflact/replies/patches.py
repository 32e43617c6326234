"""From a parsed reply to a patch: schema validation, the budget cut, appendix notes (SPEC 4)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, cast

from pydantic import ValidationError

from reflact.core.groups import FAILURE
from reflact.core.modes import Mode

LAPSES_ONLY = "execution lapses only"  # the reasoning of a failure patch made of notes alone (no patch sent)


class ReplyError(ValueError):
    """The reply's object does not fit the mode's schema; the message is used for the re-ask."""


@dataclass(frozen=True)
class CheckedReply:
    obj: dict  # the model's object, payload cut to the budget, notes normalised
    proposed: int  # items the model proposed, before the cut
    kept: int
    # False: notes were allowed and the model sent no `appendix_notes`, so the key is reflact's (the
    # patch file then puts it after `source_type`, where SkillOpt's reflect assigns it)
    notes_sent: bool = True


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


def failure_summary(raw: object) -> list[dict]:
    """Each failure pattern with `failure_type`, `count` and `description`, the fields SkillOpt's
    trainer reads; other keys the model sent are kept. A model that named them otherwise
    (pattern, root_cause, evidence) has them mapped; `count` defaults to the trajectories named."""
    entries = raw if isinstance(raw, list) else [raw] if isinstance(raw, (dict, str)) else []
    out = []
    for entry in entries:
        if isinstance(entry, str):
            entry = {"failure_type": entry}
        if not isinstance(entry, dict):
            continue
        named = entry.get("trajectories")
        count = entry.get("count")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            count = len(named) if isinstance(named, list) and named else 1
        kind = entry.get("failure_type") or entry.get("pattern") or entry.get("name") or ""
        description = entry.get("description") or " ".join(
            str(entry[k]) for k in ("root_cause", "evidence") if isinstance(entry.get(k), str) and entry[k]
        )
        out.append({**entry, "failure_type": str(kind), "count": count, "description": str(description)})
    return out


def cut(items: list, budget: int) -> list:
    """The first L items; L < 0 keeps all, L = 0 none."""
    return list(items) if budget < 0 else list(items[:budget])


def check_reply(obj: dict, mode: Mode, group: str, budget: int, notes_allowed: bool) -> CheckedReply:
    """The reply's object with its payload cut to the budget and its notes normalised; a
    ReplyError (re-asked) when the patch does not fit the mode's schema, except in a failure reply
    with notes (SPEC 4): its notes are kept in a patch with no edits, whatever is wrong with the
    patch, so that a wrong edit never costs the notes."""
    obj = dict(obj)
    if group == FAILURE.name and FAILURE.summary_key in obj:
        obj[FAILURE.summary_key] = failure_summary(obj[FAILURE.summary_key])
    notes = normalize_notes(obj.get("appendix_notes")) if notes_allowed else []
    sent = not notes_allowed or "appendix_notes" in obj
    if notes_allowed:
        obj["appendix_notes"] = notes
    try:
        return replace(_checked_patch(obj, mode, budget), notes_sent=sent)
    except ReplyError as exc:
        if group == FAILURE.name and notes:
            return _notes_only(obj, mode, str(exc))
        raise


def _checked_patch(obj: dict, mode: Mode, budget: int) -> CheckedReply:
    patch = obj.get("patch")
    items = _payload(patch, mode)
    if mode.full_rewrite:
        if len(items) != 1:
            raise ReplyError(f"'patch.{mode.payload_key}' must hold exactly one candidate, got {len(items)}")
        kept = items
    else:
        kept = cut(items, budget)
    for index, item in enumerate(kept):
        _check_item(item, index, mode)
    return CheckedReply(
        obj={**obj, "patch": {**cast(dict, patch), mode.payload_key: kept}}, proposed=len(items), kept=len(kept)
    )


def _notes_only(obj: dict, mode: Mode, why: str) -> CheckedReply:
    """A failure reply's notes in a patch with no edits: a batch of execution lapses only (no
    patch sent), or a patch that could not be used (then `unusable` says why; the raw reply is
    on disk)."""
    sent = obj.get("patch")
    if sent is None:
        return CheckedReply(obj={**obj, "patch": {"reasoning": LAPSES_ONLY, mode.payload_key: []}}, proposed=0, kept=0)
    reasoning = sent.get("reasoning") if isinstance(sent, dict) else None
    patch = {"reasoning": reasoning if isinstance(reasoning, str) else "", mode.payload_key: [], "unusable": why}
    return CheckedReply(obj={**obj, "patch": patch}, proposed=0, kept=0)


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


def _describe(err: Mapping[str, Any]) -> str:
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
    sent = all(part.notes_sent for part in parts)
    return CheckedReply(obj=merged, proposed=sum(part.proposed for part in parts), kept=len(kept), notes_sent=sent)
