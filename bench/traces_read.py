"""Reading scored traces from a sqlite store: reflact's data.source=mlflow against MLflow's own
search_traces over the same traces.

    python bench/traces_read.py [--traces 10000] [--spans 20] [--repeat 3] [--store PATH]

The store is written once with MLflow's API (finished spans through its log_spans, 100 traces a
call: an AGENT root, CHAT_MODEL turns and TOOL calls, `--spans` spans a trace; then a feedback
`correct` on each through mlflow.log_feedback: 60 % failures) and kept at --store for later rounds
(by default in /dev/shm: on this machine's disk sqlite's syncs dominate the writing).
Then, in this process, alternating which goes first, each round times:
- reflact: reflact.inputs.traces.read_traces, the whole selection mapped to runs and conversations;
- mlflow.search_traces: MLflow's own fluent search over the experiment, all traces, as the
  DataFrame it returns (3.x columns: trace_id, request, response, spans, assessments, ...);
- MlflowClient.search_traces(include_spans=True) paged with its tokens until the last page: the
  Trace objects with their spans fetched but not decoded (MLflow decodes a span when it is read).
Printed: each side's median seconds over --repeat rounds and reflact's ratio to each.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("MLFLOW_ENABLE_ASYNC_TRACE_LOGGING", "false")

EXPERIMENT = "bench-traces"


def write_store(uri: str, traces: int, spans: int) -> None:
    """The traces as finished spans, 100 traces per MLflow log_spans call (its tracer writes one
    trace at a time, ~0.3 s each here: 10,000 would take an hour), then a feedback on each."""
    import mlflow
    from mlflow.entities import AssessmentSource
    from mlflow.tracing.client import TracingClient

    mlflow.set_tracking_uri(uri)
    experiment = mlflow.set_experiment(EXPERIMENT).experiment_id
    tracing, started = TracingClient(uri), time.perf_counter()
    for first in range(0, traces, 100):
        batch = [agent_spans(experiment, i, spans) for i in range(first, min(first + 100, traces))]
        tracing.log_spans(experiment, [span for trace in batch for span in trace])
        print(f"  wrote {first + len(batch)} traces ({time.perf_counter() - started:.0f} s)", flush=True)
    source = AssessmentSource(source_type="CODE", source_id="bench")
    client = mlflow.MlflowClient(uri)
    found, token = [], None
    while True:
        page = client.search_traces(locations=[experiment], max_results=500, page_token=token, include_spans=False)
        found += [t.info.trace_id for t in page]
        if not (token := page.token):
            break
    for i, trace_id in enumerate(sorted(found)):
        mlflow.log_feedback(trace_id=trace_id, name="correct", value=i % 5 >= 3, source=source,
                            rationale="wrong amount" if i % 5 < 3 else None)
    print(f"  labelled {len(found)} traces ({time.perf_counter() - started:.0f} s)", flush=True)


def agent_spans(experiment: str, i: int, spans: int) -> list:
    """One agent run: an AGENT root, then CHAT_MODEL turns each followed by a TOOL call."""
    from mlflow.entities import Span

    trace = hashlib.sha256(f"trace {i}".encode()).digest()[:16]
    start = 1_700_000_000_000_000_000 + i * 10_000_000_000
    history = [{"role": "system", "content": "# Skill\n- Amounts are in cents."},
               {"role": "user", "content": f"refund order {i}"}]

    def span(n: int, parent: int | None, name: str, kind: str, inputs, outputs) -> Span:
        attributes = {"mlflow.traceRequestId": "tr-" + trace.hex(), "mlflow.experimentId": experiment,
                      "mlflow.spanType": kind, "mlflow.spanInputs": inputs, "mlflow.spanOutputs": outputs}
        return Span.from_dict({
            "trace_id": base64.b64encode(trace).decode(), "span_id": base64.b64encode(n.to_bytes(8, "big")).decode(),
            "parent_span_id": base64.b64encode(parent.to_bytes(8, "big")).decode() if parent else None,
            "name": name, "start_time_unix_nano": start + n * 1000, "end_time_unix_nano": start + n * 1000 + 500,
            "status": {"code": "STATUS_CODE_OK", "message": ""},
            "attributes": {key: json.dumps(value) for key, value in attributes.items()},
        })

    made = []
    for n in range(2, spans + 1):
        turn = (n - 2) // 2
        if n % 2 == 0:
            reply = {"role": "assistant", "content": f"step {turn}: looking up order {i}"}
            made.append(span(n, 1, "chat", "CHAT_MODEL", {"messages": history}, {"choices": [{"message": reply}]}))
            history = [*history, reply]
        else:
            made.append(span(n, 1, "lookup", "TOOL", {"order": i, "turn": turn}, {"amount_cents": 500 + turn}))
    root = span(1, None, "agent", "AGENT", {"question": f"refund order {i}"}, "done")
    return [root, *made]


def read_reflact(uri: str) -> int:
    from reflact.config import TracesConfig
    from reflact.inputs.traces import read_traces

    selection = read_traces(TracesConfig(experiment=EXPERIMENT, label="correct"), uri, 64 << 20, 10.0)
    return len(selection.imported.runs)


def read_mlflow(uri: str) -> int:
    import mlflow

    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name(EXPERIMENT).experiment_id
    count, token = 0, None
    while True:
        page = client.search_traces(locations=[experiment], max_results=500, page_token=token, include_spans=True)
        count += len(page)
        token = page.token
        if not token:
            return count


def read_fluent(uri: str) -> int:
    import mlflow

    mlflow.set_tracking_uri(uri)
    experiment = mlflow.MlflowClient(uri).get_experiment_by_name(EXPERIMENT).experiment_id
    return len(mlflow.search_traces(locations=[experiment], max_results=1_000_000))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", type=int, default=10000)
    parser.add_argument("--spans", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--store", type=Path, default=Path("/dev/shm/reflact-bench-traces.db"))
    args = parser.parse_args()
    uri = f"sqlite:///{args.store.resolve()}"
    if not args.store.exists():
        print(f"writing {args.traces} traces of {args.spans} spans to {args.store} ...", flush=True)
        write_store(uri, args.traces, args.spans)
    import logging

    logging.getLogger("reflact").setLevel(logging.WARNING)
    sides = {"reflact": read_reflact, "mlflow.search_traces": read_fluent, "MlflowClient.search_traces": read_mlflow}
    times: dict[str, list[float]] = {name: [] for name in sides}
    for round_ in range(args.repeat):
        order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
        for name in order:
            started = time.perf_counter()
            count = sides[name](uri)
            times[name].append(time.perf_counter() - started)
            print(f"  round {round_ + 1} {name}: {count} traces in {times[name][-1]:.2f} s", flush=True)
    medians = {name: statistics.median(t) for name, t in times.items()}
    print(f"median of {args.repeat} (python {sys.version.split()[0]}, {os.cpu_count()} cores, a shared machine):")
    for name, median in medians.items():
        ratio = "" if name == "reflact" else f"   reflact / this: {medians['reflact'] / median:.2f}x"
        print(f"  {name:28} {median:7.2f} s{ratio}")


if __name__ == "__main__":
    main()
