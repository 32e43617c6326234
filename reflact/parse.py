"""Finding the one JSON object in an optimizer reply (SPEC 4).

Rules, in order: the whole reply is an object; else exactly one distinct object inside
```json fences; else exactly one distinct object in the bare text. Two different candidates
are an error (we never guess), a brace in prose is not JSON, a reply that ends inside an
object is reported as truncated, and only a single almost-JSON object (trailing commas,
Python literals) is repaired. Every failure is a ParseError with a message meant for the
re-ask; nothing else is ever raised.
"""

from __future__ import annotations

import json
import re

_FENCED = re.compile(r"```[ \t]*(?:json|JSON|javascript|js)?[ \t]*\r?\n(.*?)```", re.S)
# a key-value start: what separates a JSON object from a brace in prose
_JSONISH = re.compile(r'"\s*:')
_OPENS_OBJECT = re.compile(r'\{\s*"[^"\n]*"\s*:')
_PY_LITERALS = {"True": "true", "False": "false", "None": "null"}


class ParseError(ValueError):
    """The reply holds no single usable JSON object; the message says why."""


def extract_object(text: object) -> dict:
    if not isinstance(text, str) or not text.strip():
        raise ParseError("the reply is empty")
    whole = _loads(text.strip())
    if whole is not None:
        if isinstance(whole, dict):
            return whole
        raise ParseError(f"the reply is JSON but a {type(whole).__name__}, not an object")

    fenced = [obj for block in _FENCED.findall(text) if isinstance(obj := _loads(block.strip()), dict)]
    if fenced:
        return _the_one(fenced, "fenced blocks")

    objects, broken, truncated = _scan(text)
    if truncated:
        raise ParseError("the reply ends inside a JSON object (it was cut off); reply with the complete object")
    if objects:
        return _the_one(objects, "reply")
    if len(broken) == 1:
        repaired = _loads(_repair(broken[0]))
        if isinstance(repaired, dict):
            return repaired
        raise ParseError(f"the JSON object does not parse: {_decode_error(broken[0])}")
    if broken:
        raise ParseError(f"the reply holds {len(broken)} malformed JSON objects; reply with exactly one")
    raise ParseError("the reply holds no JSON object")


def _the_one(candidates: list[dict], where: str) -> dict:
    distinct = {json.dumps(c, sort_keys=True): c for c in candidates}
    if len(distinct) > 1:
        raise ParseError(f"the {where} holds {len(distinct)} different JSON objects; reply with exactly one")
    return next(iter(distinct.values()))


def _loads(text: str) -> object | None:
    try:
        # strict=False accepts raw newlines inside strings, which models often emit in long texts
        return json.loads(text, strict=False)
    except (json.JSONDecodeError, RecursionError):
        return None


def _decode_error(text: str) -> str:
    try:
        json.loads(text, strict=False)
    except json.JSONDecodeError as exc:
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    except RecursionError:
        return "nested too deeply"
    return "not an object"


def _scan(text: str) -> tuple[list[dict], list[str], bool]:
    """Top-level brace spans: (objects that decode, JSON-like spans that don't, truncated?)."""
    objects: list[dict] = []
    broken: list[str] = []
    i = text.find("{")
    while i != -1:
        end = _matching_brace(text, i)
        if end is None:
            if _OPENS_OBJECT.match(text, i):  # an object that never closes: the reply was cut off
                return objects, broken, True
            i = text.find("{", i + 1)
            continue
        span = text[i:end]
        obj = _loads(span)
        if isinstance(obj, dict):
            objects.append(obj)
        elif _JSONISH.search(span):
            broken.append(span)
        # else a brace in prose such as "{name}": not JSON, and whatever it encloses isn't either
        i = text.find("{", end)
    return objects, broken, False


def _quoted(text: str) -> bytearray:
    """1 for every character inside a JSON string (quotes included), 0 elsewhere; read from the
    text's start, which is where an object starts (prose quotes before it do not count)."""
    mask = bytearray(len(text))
    inside = escaped = False
    for pos, ch in enumerate(text):
        if inside:
            mask[pos] = 1
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                inside = False
        elif ch == '"':
            mask[pos] = 1
            inside = True
    return mask


def _matching_brace(text: str, start: int) -> int | None:
    """Index after the brace closing the one at `start`, skipping JSON strings; None if never."""
    depth = 0
    quoted = _quoted(text[start:])
    for pos in range(start, len(text)):
        if quoted[pos - start]:
            continue
        ch = text[pos]
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return pos + 1 if ch == "}" else None
            if depth < 0:
                return None
    return None


_CLOSER_AHEAD = re.compile(r"\s*[}\]]")
_WORD = re.compile(r"[A-Za-z]+")


def _repair(span: str) -> str:
    """Drop trailing commas and turn Python literals into JSON ones, outside strings only."""
    quoted = _quoted(span)
    out: list[str] = []
    i = 0
    while i < len(span):
        ch = span[i]
        if not quoted[i]:
            if ch == "," and _CLOSER_AHEAD.match(span, i + 1):
                i += 1
                continue
            word = _WORD.match(span, i) if ch.isascii() and ch.isalpha() else None
            if word:
                out.append(_PY_LITERALS.get(word.group(0), word.group(0)))
                i = word.end()
                continue
        out.append(ch)
        i += 1
    return "".join(out)
