"""Turning one run into its trajectory block of a prompt (SPEC 1.2 and 1.3).

Everything that comes from a run is untrusted: multi-line text goes inside a backtick fence
longer than any backtick run in it, so no line of it can close the fence and pass itself off
as a heading or divider of the prompt, however its lines are split (CR, U+2028, form feed...);
single-line values sit after a label, never at the start of a line, with every character
that could end a line (or that a reader might take for one) shown as a visible escape.
Lone surrogates (valid in JSON, not in UTF-8) are shown as escapes too: the prompt must encode.
"""

from __future__ import annotations

import json
import re

BLOCK_DIVIDER = "\n\n---\n\n"

OPTIONAL_SECTIONS = (
    ("reference_text", "Hidden Reference"),
    ("target_system_prompt", "Target System Prompt"),
    ("target_user_prompt", "Target User Prompt"),
    ("spreadsheet_preview", "Spreadsheet Preview"),
)

_BACKTICK_RUNS = re.compile(r"`+")
# C0 controls but tab, DEL, C1 controls (U+0085 among them), line and paragraph separators and
# lone surrogates: all that str.splitlines() breaks on, and all a one-line field must not carry
_NOT_INLINE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
_SURROGATES = re.compile("[\ud800-\udfff]")


def text_of(value: object) -> str:
    """Missing values render as empty text; structured ones as compact JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (ValueError, RecursionError) as exc:
        # only values built in code get here: the loader refuses such nesting and integers
        return f"[value not shown: {type(exc).__name__}]"


def render_item(item: object) -> list[str]:
    if not isinstance(item, dict):
        return [f"[agent] {text_of(item)}"]
    if item.get("type") == "tool_call":
        return [f"[action] {text_of(item.get('cmd'))}", f"[obs] {text_of(item.get('obs'))}"]
    if "action" in item and "env_feedback" in item:
        step = text_of(item.get("step", "?")) or "?"
        lines = []
        reasoning = text_of(item.get("reasoning"))
        if reasoning:
            lines.append(f"[step {step} think] {reasoning}")
        lines.append(f"[step {step} action] {text_of(item['action'])}")
        lines.append(f"[step {step} obs] {text_of(item['env_feedback'])}")
        return lines
    if item.get("role") == "system":
        return [f"[verification] {text_of(item.get('content'))}"]
    role = text_of(item.get("role")) or "agent"
    return [f"[{role}] {text_of(item.get('content'))}"]


def render_conversation(conversation: list, max_item_chars: int | None = None) -> str:
    lines = (line for item in conversation for line in render_item(item))
    if max_item_chars is not None:
        lines = (shorten(line, max_item_chars) for line in lines)
    return "\n".join(lines)


def shorten(text: str, limit: int) -> str:
    """Keep the head and the tail, where errors and answers usually are; say what was cut."""
    if len(text) <= limit:
        return text
    keep = max(limit - 40, 20)
    head, tail = text[: keep // 2], text[len(text) - keep // 2 :]
    return f"{head} … [{len(text) - 2 * (keep // 2)} characters cut] … {tail}"


def _visible(match: re.Match) -> str:
    """A character as an escape the reader can see: \\x0b, \\u2028."""
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def fence(text: str) -> str:
    """Backtick runs are counted over the whole text, across any kind of line break, so no
    line of it can close the fence whatever a reader takes for a line break."""
    text = _SURROGATES.sub(_visible, text)
    longest = max((len(run) for run in _BACKTICK_RUNS.findall(text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}text\n{text}\n{ticks}"


def inline(value: object) -> str:
    """A one-line field: newlines shown as the two characters \\n, other line breaks and control
    characters as escapes (\\x0b, \\u2028), so it stays on its line; tabs stay as they are."""
    return _NOT_INLINE.sub(_visible, text_of(value).replace("\r", "").replace("\n", "\\n"))


def render_block(
    position: int,
    total: int,
    run_id: str,
    result: dict,
    extras: dict[str, str],
    conversation: list,
    max_item_chars: int | None = None,
) -> str:
    """One trajectory block; `extras` holds the optional sections found beside the run.

    With `max_item_chars`, long items and extras are shortened to fit a context window."""
    task = result.get("task_description") or result.get("instruction") or ""
    task_type = result.get("task_type") or result.get("instruction_type") or ""
    lines = [
        # ids are checked on loading (check_id); inline() guards callers that did not
        f"### Trajectory {position} of {total} (id: {inline(run_id)})",
        f"- Task: {inline(task)}",
        f"- Task type: {inline(task_type)}",
    ]
    fail_reason = inline(result.get("fail_reason"))
    if fail_reason.strip():
        lines.append(f"- Failure reason: {fail_reason}")
    n_turns = result.get("n_turns")
    lines.append(f"- Steps: {'?' if n_turns is None else inline(n_turns)}")
    for key, heading in OPTIONAL_SECTIONS:
        value = text_of(extras.get(key)).strip()
        if value:
            lines += ["", f"#### {heading}", fence(value if max_item_chars is None else shorten(value, max_item_chars))]
    lines += ["", "#### Trajectory", fence(render_conversation(conversation, max_item_chars))]
    return "\n".join(lines)
