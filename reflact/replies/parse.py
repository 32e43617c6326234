"""Finding the one JSON object in an optimizer reply (SPEC 4).

Rules, in order: the whole reply is an object (or a list of exactly one object); else the
candidates are the objects inside ```json fences and the objects in the bare text, and
exactly one distinct candidate must remain. Two different candidates are an error (we never
guess), and so is a list of several objects; a brace in prose is not JSON, a reply that ends
inside an object is reported as truncated, and only a single almost-JSON object (trailing
commas, Python literals) is repaired. Every failure is a ParseError with a message meant for
the re-ask; nothing else is ever raised. A string of the object holding an escaped lone
surrogate ("\\ud83d", half an emoji cut by the model) is repaired (U+FFFD), so the patch can be
written, logged and cached like any other.

Time is linear in the reply's length whatever it holds: the text is scanned once for its
brackets, quotes and backslashes (see _closers), and json decodes any character at most a few
times (the whole reply, a fence, a span, the one repair).
"""

from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass, field

from reflact.core.files import repair_text

_FENCED = re.compile(r"```[ \t]*(?:json|JSON|javascript|js)?[ \t]*\r?\n(.*?)```", re.S)
# a key-value start: what separates a JSON object from a brace in prose
_JSONISH = re.compile(r'"\s*:')
_OPENS_OBJECT = re.compile(r'\{\s*"[^"\n]*"\s*:')
_PY_LITERALS = {"True": "true", "False": "false", "None": "null"}
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
# deeper than any reply schema needs; deeper objects are refused before anything recurses on them
MAX_DEPTH = 100


class ParseError(ValueError):
    """The reply holds no single usable JSON object; the message says why."""


def extract_object(text: object) -> dict:
    obj = _extract(text)
    # JSON's \u escapes can make a surrogate that the reply text did not hold; the walk over
    # every string is done only when one may be there
    if isinstance(text, str) and _may_hold_surrogate(text):
        return {repair_text(key): _repaired(value) for key, value in obj.items()}
    return obj


def _may_hold_surrogate(text: str) -> bool:
    # two cheap tests rather than one regex alternation, which scans several times slower
    return ("\\u" in text and bool(_ESCAPED_SURROGATE.search(text))) or (
        not text.isascii() and bool(_SURROGATE.search(text))
    )


def _repaired(value: object) -> object:
    """`value` with every string (keys too) made writable; the depth is capped at decoding."""
    if isinstance(value, str):
        return repair_text(value)
    if isinstance(value, list):
        return [_repaired(item) for item in value]
    if isinstance(value, dict):
        return {repair_text(key): _repaired(item) for key, item in value.items()}
    return value


def _extract(text: object) -> dict:
    if not isinstance(text, str) or not text.strip():
        raise ParseError("the reply is empty")
    whole, _ = _decode(text.strip())
    if whole is not None:
        obj = _single_object(whole, "the reply")
        if obj is None:
            raise ParseError(f"the reply is JSON but a {type(whole).__name__}, not an object")
        return obj

    scan = _scan(text)
    if scan.truncated:
        raise ParseError("the reply ends inside a JSON object (it was cut off); reply with the complete object")
    candidates = _fenced(text, scan.spans) + scan.objects
    if candidates:
        return _the_one(candidates)
    if len(scan.broken) == 1:
        repaired, _ = _decode(_repair(scan.broken[0]))
        if isinstance(repaired, dict):
            return repaired
        raise ParseError(f"the JSON object does not parse: {_decode(scan.broken[0])[1] or 'not an object'}")
    if scan.broken:
        raise ParseError(f"the reply holds {len(scan.broken)} malformed JSON objects; reply with exactly one")
    raise ParseError("the reply holds no JSON object")


def _single_object(value: object, where: str) -> dict | None:
    """The object a decoded value stands for: itself, or the only item of a one-item list.
    A list of several items with an object among them is ambiguous: an error."""
    if isinstance(value, dict):
        return value
    if isinstance(value, list) and any(isinstance(item, dict) for item in value):
        if len(value) == 1:
            return value[0]
        raise ParseError(f"{where} is a JSON list of {len(value)} items; reply with exactly one object, not a list")
    return None


def _fenced(text: str, spans: list[tuple[int, int]]) -> list[dict]:
    """Objects in ```json fences, except fences inside a bare object (there they are text in
    one of its strings, e.g. a skill document showing an example)."""
    starts = [start for start, _ in spans]
    found = []
    for match in _FENCED.finditer(text):
        at = bisect.bisect_right(starts, match.start()) - 1
        if at >= 0 and spans[at][1] >= match.end():
            continue
        value, _ = _decode(match.group(1).strip())
        obj = _single_object(value, "a fenced block")
        if obj is not None:
            found.append(obj)
    return found


def _the_one(candidates: list[dict]) -> dict:
    try:
        distinct = {json.dumps(c, sort_keys=True): c for c in candidates}
    except RecursionError:  # depth is capped at decoding already; this only guards the stack
        raise ParseError(f"the JSON object is nested more than {MAX_DEPTH} levels deep") from None
    if len(distinct) > 1:
        raise ParseError(f"the reply holds {len(distinct)} different JSON objects; reply with exactly one")
    return next(iter(distinct.values()))


def _decode(text: str) -> tuple[object | None, str]:
    """(value, "") or (None, why it does not decode)."""
    try:
        # strict=False accepts raw newlines inside strings, which models often emit in long texts
        value = json.loads(text, strict=False)
    except json.JSONDecodeError as exc:
        return None, f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    except RecursionError:
        return None, f"nested more than {MAX_DEPTH} levels deep"
    except ValueError:  # an integer past Python's digit limit for str -> int
        return None, "a number has too many digits"
    if _too_deep(value):
        return None, f"nested more than {MAX_DEPTH} levels deep"
    return value, ""


def _too_deep(value: object) -> bool:
    """Level by level, without recursion (a deep value must not exhaust the stack here)."""
    level, depth = [value], 0
    while level:
        containers = [v for v in level if isinstance(v, (dict, list))]
        if containers:
            depth += 1
            if depth > MAX_DEPTH:
                return True
        level = [item for c in containers for item in (c.values() if isinstance(c, dict) else c)]
    return False


@dataclass
class _Scan:
    objects: list[dict] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)  # where each object is, in order
    broken: list[str] = field(default_factory=list)  # JSON-like spans that do not decode
    truncated: bool = False


def _scan(text: str) -> _Scan:
    """Top-level brace spans, left to right. A `{` is tried as an object's start: if its brackets
    close with a `}`, the span is an object, a broken object, or prose (skipped whole). If they
    never close, or a `]` closes them, it is a prose brace and the next `{` is tried, unless it
    opens like an object: then it was cut off, or (closed by `]`) it is a broken object."""
    scan = _Scan()
    positions, chars, closer = _closers(text)
    resume = 0
    for k, ch in enumerate(chars):
        if ch != "{" or positions[k] < resume:
            continue
        start, end = positions[k], closer[k]
        if (end < 0 or chars[end] == "]") and not _OPENS_OBJECT.match(text, start):
            continue
        if end < 0:  # an object that never closes: the reply was cut off
            scan.truncated = True
            return scan
        resume = positions[end] + 1
        span = text[start:resume]
        obj, _ = _decode(span)
        if isinstance(obj, dict):
            scan.objects.append(obj)
            scan.spans.append((start, resume))
        elif _JSONISH.search(span):
            scan.broken.append(span)
        # else a brace in prose such as "{name}": not JSON, and whatever it encloses isn't either
    return scan


_TOKENS = re.compile(r'[{}\[\]"\\]')
_OUT, _IN, _ESC = 0, 1, 2  # outside a string, inside one, inside one right after a backslash


def _closers(text: str) -> tuple[list[int], list[str], list[int]]:
    """The brackets, quotes and backslashes from the text's first `{` on (nothing before it can
    start an object): their positions, their characters and, for every opener, the index of the
    bracket that brings the depth back to 0 when counting starts at that opener outside any
    string (-1 if none does).

    Each opener reads quotes from itself on, so the answer differs per opener (a prose quote
    before it must not count). Computed for all of them at once from right to left: `nxt[s][k]`
    is the first bracket outside strings at or after token k when the string state there is s,
    and `ends[k]`, for a bracket k, the closer that ends the run of sibling groups starting at k.
    Both only look to the right, so one pass fills them."""
    positions, chars = [], []
    first = text.find("{")
    for match in _TOKENS.finditer(text, first if first >= 0 else len(text)):
        positions.append(match.start())
        chars.append(match.group())
    count = len(chars)
    positions.append(len(text) + 1)  # a sentinel: a gap before it changes nothing
    nxt = ([count] * (count + 1), [count] * (count + 1), [count] * (count + 1))
    ends = [-1] * (count + 1)
    closer = [-1] * count
    for k in range(count - 1, -1, -1):
        ch = chars[k]
        # other characters before the next token spend an escape
        after = (_AFTER_GAP if positions[k + 1] > positions[k] + 1 else _AFTER).get(ch, _AFTER_BRACKET)
        nxt[_OUT][k] = k if ch in "{}[]" else nxt[after[_OUT]][k + 1]
        nxt[_IN][k] = nxt[after[_IN]][k + 1]
        nxt[_ESC][k] = nxt[after[_ESC]][k + 1]
        if ch in "{[":
            closer[k] = ends[nxt[_OUT][k + 1]]
            ends[k] = ends[nxt[_OUT][closer[k] + 1]] if closer[k] >= 0 else -1
        elif ch in "}]":
            ends[k] = k
    return positions, chars, closer


# the string state after one token, indexed by the state before it (_OUT, _IN, _ESC)
_AFTER = {'"': (_IN, _OUT, _IN), "\\": (_OUT, _ESC, _IN)}
_AFTER_GAP = {'"': (_IN, _OUT, _IN), "\\": (_OUT, _IN, _IN)}
_AFTER_BRACKET = (_OUT, _IN, _IN)
_CLOSER_AHEAD = re.compile(r"\s*[}\]]")
_WORD = re.compile(r"[A-Za-z]+")


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
