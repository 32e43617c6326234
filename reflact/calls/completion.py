"""Reading a chat-completion body without trusting it.

The SDK builds its objects without validating, so a proxy's page or a torn or hostile reply
would surface later as a crash far from its cause. Every body is read here instead, against
the shape the stage needs:

- a body that is not a JSON object, that has no first choice (`choices` missing, null, empty or
  not a list), or whose `choices[0].message`, `.message.content` or `.finish_reason` has the
  wrong type, is malformed (`MalformedReply`, retried like any transient fault);
- content that is valid but empty (null, "" or absent) is a reply like any other (the stage
  asks again);
- `service_tier` names the tier that served the reply (its price applies); anything but a short
  word is taken as not said;
- `usage` only feeds the token and cost counts, so a reply is not thrown away for it: a count
  that is missing or null is 0; one that is not a plausible count (a string, a list, negative,
  fractional, not finite, huge) also counts as 0, with a warning naming the field; a part larger
  than its total (cached > prompt tokens) is cut to the total, also with a warning.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass

from reflact.calls.protocol import Usage
from reflact.core.files import repair_text

# no model reads or writes this many tokens in one call: a larger count is garbage, not usage
MAX_TOKENS = 10**9


class MalformedReply(Exception):
    """A reply body that is not a chat completion; the message names what was wrong."""

    def __str__(self) -> str:
        return f"malformed reply: {self.args[0]}"


@dataclass
class Completion:
    text: str
    finish_reason: str | None
    usage: Usage
    service_tier: str = ""  # the tier that served it, as the body names it ("" when it does not)


def kind(value: object) -> str:
    """What a JSON value is, for a message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "an empty string" if not value else "a string"
    return "a list" if isinstance(value, list) else "an object"


def clean(text: str) -> str:
    """JSON may carry lone surrogates ("\\ud800"); they cannot be written as UTF-8, so a reply
    holding one would fail where it is saved. They become U+FFFD (a split pair is joined)."""
    return repair_text(text)


def read_completion(content: bytes, warn: Callable[[str, str], None]) -> Completion:
    """The reply's text, finish reason and tokens; `warn(field, what)` hears of unreadable counts."""
    body = parse_body(content)
    message, finish_reason = first_choice(body)
    text = message.get("content")
    if text is not None and not isinstance(text, str):
        raise MalformedReply(f"choices[0].message.content is {kind(text)}")
    if finish_reason is not None and not isinstance(finish_reason, str):
        raise MalformedReply(f"choices[0].finish_reason is {kind(finish_reason)}")
    return Completion(
        clean(text or ""),
        clean(finish_reason) if finish_reason else finish_reason,
        read_usage(body.get("usage"), warn),
        served_tier(body.get("service_tier")),
    )


def served_tier(value: object) -> str:
    """The body's `service_tier`: a short word, else "" (not said: the listed price applies)."""
    if isinstance(value, str) and 0 < len(value) <= 40 and value.replace("_", "").replace("-", "").isalnum():
        return value
    return ""


def whole_number(digits: str) -> int | float:
    # Python refuses to convert integers of over 4300 digits (a ValueError for the whole body);
    # such a number can only be garbage, read as infinity and judged where it is used
    return int(digits) if len(digits) < 100 else (-math.inf if digits.startswith("-") else math.inf)


def parse_body(content: bytes) -> dict:
    try:
        body = json.loads(content, parse_int=whole_number)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested beyond the parser
        snippet = " ".join(content[:80].decode("utf-8", "replace").split())
        raise MalformedReply(f"the body is not JSON ({snippet!r})" if snippet else "the body is empty") from None
    if not isinstance(body, dict):
        raise MalformedReply(f"the body is {kind(body)}, not an object")
    return body


def first_choice(body: dict) -> tuple[dict, object]:
    """(choices[0].message, choices[0].finish_reason), the shapes checked."""
    if "choices" not in body:
        error = body.get("error")
        said = error.get("message") if isinstance(error, dict) else error
        raise MalformedReply(f"no choices; the server said: {str(said)[:200]}" if said else "no choices")
    choices = body["choices"]
    if not isinstance(choices, list):
        raise MalformedReply(f"choices is {kind(choices)}")
    if not choices:
        raise MalformedReply("choices is empty")
    choice = choices[0]
    if not isinstance(choice, dict):
        raise MalformedReply(f"choices[0] is {kind(choice)}")
    message = choice.get("message")
    if not isinstance(message, dict):
        raise MalformedReply(
            "choices[0] has no message" if "message" not in choice else f"choices[0].message is {kind(message)}"
        )
    return message, choice.get("finish_reason")


def read_usage(usage: object, warn: Callable[[str, str], None]) -> Usage:
    if usage is None:
        return Usage()
    if not isinstance(usage, dict):
        warn("usage", f"is {kind(usage)}; all its tokens count as 0")
        return Usage()
    prompt = count(usage, "prompt_tokens", "usage", warn)
    completion = count(usage, "completion_tokens", "usage", warn)
    cached = detail(usage, "prompt_tokens_details", "cached_tokens", warn)
    reasoning = detail(usage, "completion_tokens_details", "reasoning_tokens", warn)
    return Usage(
        prompt=prompt or 0,
        cached=part(cached, prompt, "usage.prompt_tokens_details.cached_tokens", warn),
        completion=completion or 0,
        reasoning=part(reasoning, completion, "usage.completion_tokens_details.reasoning_tokens", warn),
    )


def part(value: int | None, whole: int | None, path: str, warn: Callable[[str, str], None]) -> int:
    """A part of a count (cached of prompt, reasoning of completion), never more than its whole
    when that is known: it would count more cached tokens than were sent."""
    value = value or 0
    if whole is not None and value > whole:
        warn(path, f"is more than its total ({value} > {whole}); counted as {whole}")
        return whole
    return value


def detail(usage: dict, details_key: str, key: str, warn: Callable[[str, str], None]) -> int | None:
    details = usage.get(details_key)
    if details is None:
        return None
    if not isinstance(details, dict):
        warn(f"usage.{details_key}", f"is {kind(details)}; its tokens count as 0")
        return None
    return count(details, key, f"usage.{details_key}", warn)


def count(parent: dict, key: str, path: str, warn: Callable[[str, str], None]) -> int | None:
    """A token count: a non-negative whole number up to MAX_TOKENS; None when absent or (warned)
    unreadable."""
    value = parent.get(key)
    if value is None:
        return None
    why = ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        why = kind(value)
    elif value < 0:
        why = "negative"
    elif value > MAX_TOKENS:  # infinity included
        why = "implausibly large"
    elif isinstance(value, float) and not value.is_integer():  # NaN included
        why = "not a whole number"
    if why:
        warn(f"{path}.{key}", f"is {why} ({str(value)[:30]}); counted as 0")
        return None
    return int(value)
