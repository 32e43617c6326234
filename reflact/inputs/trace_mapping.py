"""One MLflow trace as one scored run: its label's pass or fail, its task and its conversation.

The conversation is rebuilt from the trace's spans, in the order they started: each CHAT_MODEL
span adds the messages its input has beyond what the earlier ones showed (an agent sends the whole
history every turn), then its reply; each TOOL span is a tool call with its arguments and result.
Only the outermost span of each kind counts: a framework's chat span wrapping the client's own,
or a tool calling a tool, would otherwise show the same turn twice. When TOOL spans exist they are
the tool calls, and the calls and results the chat messages repeat are left out.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from reflact.inputs.importers import Converted, convert_messages, message_text

# MLflow's span attributes (mlflow.tracing.constant.SpanAttributeKey) and span types
SPAN_TYPE, INPUTS, OUTPUTS = "mlflow.spanType", "mlflow.spanInputs", "mlflow.spanOutputs"
CHAT = "CHAT_MODEL"
TOOL = "TOOL"
PASSING = ("yes", "true", "pass", "passed")
FAILING = ("no", "false", "fail", "failed")


class NoChat(ValueError):
    """A trace without a CHAT_MODEL span: there is no conversation to show."""


@dataclass(frozen=True, slots=True)
class SpanView:
    """What the mapping reads of a span, read once from the span's dict (Span.to_dict): a span read
    from a database store is kept as that dict until a property is read, and building MLflow's
    span object from it took most of the time of reading 10,000 traces (bench/traces_read.py)."""

    span_id: str
    parent_id: str | None
    span_type: str
    name: str
    start_time_ns: int
    end_time_ns: int
    inputs: object
    outputs: object

    @classmethod
    def of(cls, span) -> SpanView:
        d = span.to_dict()
        attributes = d.get("attributes") or {}
        start = int(d.get("start_time_unix_nano") or 0)
        return cls(
            span_id=str(d.get("span_id")),
            parent_id=d.get("parent_span_id") or None,
            span_type=str(_attribute(attributes, SPAN_TYPE) or ""),
            name=str(d.get("name") or ""),
            start_time_ns=start,
            end_time_ns=int(d.get("end_time_unix_nano") or start),
            inputs=_attribute(attributes, INPUTS),
            outputs=_attribute(attributes, OUTPUTS),
        )


def _attribute(attributes: dict, key: str) -> object:
    """An attribute's value: MLflow stores each as JSON text (a text that is not JSON is itself)."""
    value = attributes.get(key)
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def span_views(trace) -> list[SpanView]:
    """The trace's spans in the order they started."""
    return sorted(map(SpanView.of, trace.data.spans), key=lambda s: (s.start_time_ns, s.span_id))


@dataclass(frozen=True)
class Label:
    """The label's feedback on one trace: its value, the pass rule's verdict (None: fits no rule)."""

    value: object
    passed: bool | None
    rationale: str


def label_of(info, name: str, threshold: float) -> Label | None:
    """The newest valid feedback named `name` on the trace (None: the trace is unlabelled)."""
    found = [
        a
        for a in info.assessments
        if a.name == name and getattr(a, "feedback", None) is not None and a.valid is not False and a.value is not None
    ]
    if not found:
        return None
    newest = max(found, key=lambda a: (a.last_update_time_ms or 0, a.create_time_ms or 0))
    return Label(newest.value, passes(newest.value, threshold), newest.rationale or "")


def passes(value: object, threshold: float) -> bool | None:
    """yes/true/pass or a non-zero number for text and booleans, a number at or above the threshold
    for scores; None for what fits none of them."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value >= threshold if math.isfinite(value) else None
    if not isinstance(value, str):
        return None
    text = value.strip().lower()
    if text in PASSING or text in FAILING:
        return text in PASSING
    try:
        number = float(text)
    except ValueError:
        return None
    return number != 0 if math.isfinite(number) else None


def reference(info) -> str:
    """The trace's expectations as the hidden reference: one value alone, several by name."""
    found = sorted(
        (a.name, _text(a.value))
        for a in info.assessments
        if getattr(a, "expectation", None) is not None and a.valid is not False
    )
    if len(found) == 1:
        return found[0][1]
    return "\n".join(f"{name}: {value}" for name, value in found)


def trace_row(trace, spans: list[SpanView], label: Label) -> tuple[dict, Converted]:
    """The results row and the conversation of a labelled trace; NoChat without a CHAT_MODEL span."""
    parents = {s.span_id: s for s in spans}
    chats = outermost(spans, parents, CHAT)
    if not chats:
        raise NoChat(trace.info.trace_id)
    tools = [s for s in outermost(spans, parents, TOOL) if not _under(s, parents, CHAT)]
    converted = convert_messages(conversation_messages(chats, tools), trace.info.trace_id)
    root = next((s for s in spans if s.parent_id is None), spans[0])
    row: dict = {
        "id": trace.info.trace_id,
        "hard": 1.0 if label.passed else 0.0,
        "task_description": task_text(root.inputs) or converted.first_user or "",
        "n_turns": len(chats),
        "label": label.value,
    }
    if not label.passed and label.rationale:
        row["fail_reason"] = label.rationale
    if ref := reference(trace.info):
        row["reference_text"] = ref
    return row, converted


def outermost(spans: list, parents: dict, kind: str) -> list:
    return [s for s in spans if s.span_type == kind and not _under(s, parents, kind)]


def _under(span, parents: dict, kind: str) -> bool:
    """Whether a span of type `kind` encloses `span` (walked up by parent ids, cycles cut)."""
    seen, parent = {span.span_id}, parents.get(span.parent_id)
    while parent is not None and parent.span_id not in seen:
        if parent.span_type == kind:
            return True
        seen.add(parent.span_id)
        parent = parents.get(parent.parent_id)
    return False


def conversation_messages(chats: list, tools: list) -> list[dict]:
    """Chat messages in time order: each chat span's new input messages at its start and its reply
    at its end, each tool span as a call and its result at its start."""
    events: list[tuple[int, int, dict]] = []

    def add(at: int, messages: list, own: bool = False) -> None:
        for message in messages:
            shown = _beside_tools(message) if tools and not own else message
            if shown is not None:
                events.append((at, len(events), shown))

    seen: list = []
    for chat in chats:
        messages, reply = chat_input(chat.inputs), chat_output(chat.outputs)
        add(chat.start_time_ns, messages[_shared_prefix(seen, messages) :])
        add(chat.end_time_ns, [reply] if reply else [])
        seen = messages + ([reply] if reply else [])
    for tool in tools:
        add(tool.start_time_ns, _tool_messages(tool), own=True)
    return [message for _, _, message in sorted(events, key=lambda e: (e[0], e[1]))]


def _shared_prefix(seen: list, messages: list) -> int:
    """How many messages open both lists, compared by what they say: a reply as the client logged
    it carries fields (refusal, annotations) the agent leaves out when it sends it back."""
    n = 0
    while n < min(len(seen), len(messages)) and _said(seen[n]) == _said(messages[n]):
        n += 1
    return n


def _said(message: object) -> object:
    if not isinstance(message, dict):
        return message
    calls = [c.get("function") or c for c in message.get("tool_calls") or [] if isinstance(c, dict)]
    return (
        message.get("role"),
        message_text(message.get("content")),
        [(c.get("name"), c.get("arguments")) for c in calls if isinstance(c, dict)],
        message.get("tool_call_id"),
    )


def _beside_tools(message: object):
    """A chat message without what the TOOL spans say (the calls it asks for, the results it
    passes back); None when nothing else is left of it."""
    if not isinstance(message, dict):
        return message
    if message.get("role") in ("tool", "function"):
        return None
    if message.get("role") == "assistant" and (message.get("tool_calls") or message.get("function_call")):
        text = message_text(message.get("content"))
        return {"role": "assistant", "content": text} if text.strip() else None
    return message


def _tool_messages(tool) -> list[dict]:
    """A TOOL span as the call and its reply, which convert_messages pairs into one tool_call item."""
    arguments = tool.inputs if isinstance(tool.inputs, str) else json.dumps(tool.inputs, ensure_ascii=False)
    call = {"id": tool.span_id, "function": {"name": tool.name, "arguments": arguments}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": tool.span_id, "content": _text(tool.outputs)},
    ]


def chat_input(inputs: object) -> list:
    """The messages a chat span was sent: {"messages": [...]}, a list, or a text as a user turn."""
    if isinstance(inputs, dict) and isinstance(inputs.get("messages"), list):
        return list(inputs["messages"])
    if isinstance(inputs, list):
        return list(inputs)
    return [{"role": "user", "content": _text(inputs)}] if inputs else []


def chat_output(outputs: object) -> dict | None:
    """The reply: a chat completion's first choice, a message, or a text as an assistant turn."""
    if isinstance(outputs, dict) and isinstance(outputs.get("choices"), list) and outputs["choices"]:
        choice = outputs["choices"][0]
        message = choice.get("message") if isinstance(choice, dict) else None
        return message if isinstance(message, dict) else {"role": "assistant", "content": _text(choice)}
    if isinstance(outputs, dict) and "role" in outputs:
        return outputs
    return {"role": "assistant", "content": _text(outputs)} if outputs is not None else None


def task_text(inputs: object) -> str:
    """The root span's inputs as the task: a text, a single text field, else the inputs as JSON."""
    if isinstance(inputs, str):
        return inputs
    if isinstance(inputs, dict):
        texts = [v for v in inputs.values() if isinstance(v, str)]
        if len(inputs) == 1 and texts:
            return texts[0]
        if isinstance(inputs.get("messages"), list):
            return ""  # a chat call as the root: its first user turn is the task
    return _text(inputs) if inputs else ""


def _text(value: object) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
