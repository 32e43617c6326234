"""Log a few agent traces with feedback to MLflow, as an instrumented agent and its reviewers would.

    python examples/mlflow_traces.py            # writes to outputs/mlflow.db, experiment "support-agent"

Each trace has an AGENT root span (the question), two CHAT_MODEL spans (the model's turns, the
system message being the skill) and a TOOL span (the refund call), then a feedback "correct" from
a reviewer (with why, when it failed) and an expectation (the answer that was wanted). reflact
reads them with data.source=mlflow (see docs/mlflow.md, "From your MLflow traces").
"""

from __future__ import annotations

import os
from pathlib import Path

import mlflow
from mlflow.entities import AssessmentSource, SpanType

SKILL = """# Support skill

## Refunds
- Look up the order before acting on it.
- Amounts passed to refund() are in cents.
"""
# (question, cents the agent refunded, whether it was right, the reviewer's rationale, the expected answer)
RUNS = [
    ("Refund order 17, it cost 12.50 USD", 1250, True, None, "Refunded 12.50 USD"),
    ("Refund order 18 (8.00 USD)", 8, False, "Refunded 8 cents: the amount was not converted to cents", "Refunded 8.00 USD"),
    ("Please refund order 19, 3.20 USD", 320, True, None, "Refunded 3.20 USD"),
    ("Order 20 was 45.00 USD, refund it", 45, False, "Refunded 45 cents instead of 4500", "Refunded 45.00 USD"),
    ("Refund order 21 without looking it up", 990, False, "Refunded without looking the order up", "Looked up, then refunded 9.90 USD"),
]


def agent_run(question: str, cents: int) -> str:
    """One run of the agent, traced as MLflow's autologging would trace it; its trace id."""
    with mlflow.start_span("support_agent", span_type=SpanType.AGENT) as root:
        root.set_inputs({"question": question})
        messages = [{"role": "system", "content": SKILL}, {"role": "user", "content": question}]
        call = {"id": "call_1", "type": "function", "function": {"name": "refund", "arguments": f'{{"cents": {cents}}}'}}
        turn = {"role": "assistant", "content": None, "tool_calls": [call]}
        with mlflow.start_span("chat", span_type=SpanType.CHAT_MODEL) as chat:
            chat.set_inputs({"messages": messages})
            chat.set_outputs({"choices": [{"message": turn}]})
        with mlflow.start_span("refund", span_type=SpanType.TOOL) as tool:
            tool.set_inputs({"cents": cents})
            tool.set_outputs({"status": "refunded", "cents": cents})
        answer = {"role": "assistant", "content": f"Refunded {cents} cents."}
        with mlflow.start_span("chat", span_type=SpanType.CHAT_MODEL) as chat:
            chat.set_inputs({"messages": [*messages, turn, {"role": "tool", "tool_call_id": "call_1", "content": "ok"}]})
            chat.set_outputs({"choices": [{"message": answer}]})
        root.set_outputs(answer["content"])
    return root.trace_id


def main() -> None:
    os.environ.setdefault("MLFLOW_ENABLE_ASYNC_TRACE_LOGGING", "false")  # every trace written before we go on
    Path("outputs").mkdir(exist_ok=True)
    mlflow.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///outputs/mlflow.db"))
    mlflow.set_experiment("support-agent")
    reviewer = AssessmentSource(source_type="HUMAN", source_id="reviewer@example.com")
    for question, cents, correct, why, expected in RUNS:
        trace_id = agent_run(question, cents)
        mlflow.log_feedback(trace_id=trace_id, name="correct", value=correct, rationale=why, source=reviewer)
        mlflow.log_expectation(trace_id=trace_id, name="expected_response", value=expected, source=reviewer)
    print(f"logged {len(RUNS)} traces with feedback 'correct' to experiment 'support-agent'")


if __name__ == "__main__":
    main()
