"""Applying a patch's edits to a skill text (SPEC 5), for previews and "would apply" counts.

Pure functions on strings: nothing here reads files or calls a model, so the stage, the
summary and the tracker can all preview a candidate skill the same way.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from reflact.core.modes import EDIT_OPS, NEEDS_CONTENT, NEEDS_TARGET

PROTECTED_MARKERS = (
    ("<!-- SLOW_UPDATE_START -->", "<!-- SLOW_UPDATE_END -->"),
    ("<!-- APPENDIX_START -->", "<!-- APPENDIX_END -->"),
)

APPLIED, FALLBACK, SKIPPED = "applied", "fallback", "skipped"


@dataclass(frozen=True)
class EditStatus:
    """What happened to one edit; `reason` is empty when it applied as asked."""

    index: int
    op: str
    status: str  # "applied", "fallback" or "skipped"
    reason: str = ""


@dataclass(frozen=True)
class Span:
    start: int
    end: int  # exclusive
    open: bool = False  # a start marker without its end: the region runs to the end of the text

    def overlaps(self, start: int, end: int) -> bool:
        return start < self.end and end > self.start

    def strictly_contains(self, pos: int) -> bool:
        """Inside, not at an edge; but the end of an open region is the end of the text, inside it."""
        return self.start < pos < self.end or (self.open and self.start < pos == self.end)


def apply_edits(skill: str, edits: list[dict]) -> tuple[str, list[EditStatus]]:
    """Apply `edits` in order to the evolving text; return the new text and one status per edit."""
    text = skill
    statuses = []
    for index, edit in enumerate(edits):
        text, status = apply_edit(text, edit, index)
        statuses.append(status)
    return text, statuses


def apply_edit(text: str, edit: object, index: int = 0) -> tuple[str, EditStatus]:
    """One edit on `text`; a skipped edit returns the text unchanged."""
    if not isinstance(edit, dict):
        return text, EditStatus(index, "", SKIPPED, "edit is not an object")
    op = edit.get("op")
    op_name = op if isinstance(op, str) else ""
    problem = _field_problem(edit, op)
    if problem:
        return text, EditStatus(index, op_name, SKIPPED, problem)
    op = op_name  # a known op from here on
    content: str = edit.get("content") or ""  # None only for an op without content
    if op == "append":
        return append(text, content), EditStatus(index, op, APPLIED)
    target = edit["target"]
    at = text.find(target)
    if at < 0:
        if op == "insert_after":
            return append(text, content), EditStatus(index, op, FALLBACK, "target not found")
        return text, EditStatus(index, op, SKIPPED, "target not found")
    regions = protected_regions(text)
    end = at + len(target)
    if any(region.overlaps(at, end) for region in regions):
        return text, EditStatus(index, op, SKIPPED, "target in protected region")
    if op == "insert_after":
        pos = _after_line(text, end)
        if any(region.strictly_contains(pos) for region in regions):
            return text, EditStatus(index, op, SKIPPED, "insertion point in protected region")
        return _insert_line(text, pos, content), EditStatus(index, op, APPLIED)
    if op == "replace" and content:
        return text[:at] + content + text[end:], EditStatus(index, op, APPLIED)
    return _remove(text, at, end), EditStatus(index, op, APPLIED)


def _field_problem(edit: dict, op: object) -> str:
    """Why the edit cannot be applied at all, or "" when its fields are usable."""
    if op not in EDIT_OPS:
        return "unknown op"
    if op in NEEDS_TARGET:
        target = edit.get("target")
        if not isinstance(target, str) or not target:
            return "missing target"
    if op in NEEDS_CONTENT:
        content = edit.get("content")
        if not isinstance(content, str):
            return "missing content"
        if _has_marker(content):
            # the optimizer must not be able to forge or split a protected region
            return "content contains a protected-region marker"
    return ""


def _has_marker(content: str) -> bool:
    return any(marker in content for pair in PROTECTED_MARKERS for marker in pair)


def protected_regions(text: str) -> list[Span]:
    """Spans (markers included) that edits must not touch.

    A start marker without its end protects up to the end of the text, and a lone end marker
    protects itself: when in doubt, protect.
    """
    spans = []
    for start_marker, end_marker in PROTECTED_MARKERS:
        spans.extend(_pair_spans(text, start_marker, end_marker))
    return sorted(spans, key=lambda span: (span.start, span.end))


def _pair_spans(text: str, start_marker: str, end_marker: str) -> list[Span]:
    spans = []
    pos = 0
    while (start := text.find(start_marker, pos)) >= 0:
        close = text.find(end_marker, start + len(start_marker))
        end = len(text) if close < 0 else close + len(end_marker)
        spans.append(Span(start, end, open=close < 0))
        pos = end
    pos = 0
    while (lone := text.find(end_marker, pos)) >= 0:
        pos = lone + len(end_marker)
        if not any(span.overlaps(lone, pos) for span in spans):
            spans.append(Span(lone, pos))
    return spans


def append_point(text: str) -> int:
    """Where `append` inserts: before the protected regions that end the text, else at the end.

    Regions count as trailing when only whitespace lies between them and after the last one.
    """
    point = len(text)
    for region in reversed(_merged(protected_regions(text))):
        if text[region.end : point].strip():
            break
        point = region.start
    return point


def _merged(spans: list[Span]) -> list[Span]:
    merged: list[Span] = []
    for span in spans:
        if merged and span.start <= merged[-1].end:
            merged[-1] = Span(merged[-1].start, max(merged[-1].end, span.end))
        else:
            merged.append(span)
    return merged


def append(text: str, content: str) -> str:
    """`content` on its own line(s) right after the last unprotected content.

    Whitespace that separated that content from what follows (a blank line before a protected
    region, a final newline) is kept after the new content.
    """
    point = append_point(text)
    head, tail = text[:point], text[point:]
    core = head.rstrip()
    gap = head[len(core) :]
    if core:
        gap = gap.split("\n", 1)[1] if "\n" in gap else ""
        core += "\n"
    return core + _as_line(content) + gap + tail


def _after_line(text: str, end: int) -> int:
    """The position just after the line on which the character before `end` sits."""
    newline = text.find("\n", end - 1)
    return len(text) if newline < 0 else newline + 1


def _insert_line(text: str, pos: int, content: str) -> str:
    head = text[:pos]
    if head and not head.endswith("\n"):
        head += "\n"
    return head + _as_line(content) + text[pos:]


def _as_line(content: str) -> str:
    return content if content.endswith("\n") else content + "\n"


def _remove(text: str, start: int, end: int) -> str:
    """Cut text[start:end]; when that was a whole line, its line break goes too (no empty line left)."""
    line_start = start == 0 or text[start - 1] == "\n"
    line_end = end == len(text) or text[end] == "\n"
    if line_start and line_end and text[end - 1] != "\n":
        if end < len(text):
            end += 1  # the line's own newline
        elif start > 0:
            start -= 1  # last line without a newline: drop the break before it
    return text[:start] + text[end:]


def unified_diff(old: str, new: str, name: str) -> str:
    """A `diff -u` style text of old -> new ("" when equal), readable in logs and artifacts."""
    lines = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        fromfile=f"a/{name}",
        tofile=f"b/{name}",
    )
    out = []
    for line in lines:
        if line.endswith("\n"):
            out.append(line)
        else:
            out.append(line + "\n\\ No newline at end of file\n")
    return "".join(out)


def apply_counts(statuses: list[EditStatus]) -> dict:
    """Counts per status and the share of edits that would change the skill."""
    counts = {APPLIED: 0, FALLBACK: 0, SKIPPED: 0}
    for status in statuses:
        counts[status.status] += 1
    total = len(statuses)
    share = (counts[APPLIED] + counts[FALLBACK]) / total if total else 0.0
    return {**counts, "total": total, "apply_share": share}
