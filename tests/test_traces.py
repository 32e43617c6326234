"""Each request is one MLflow trace linked to its run, written many at a time (reflact.tracking.store):
what a trace holds, a failed request's trace, a batch written again, more requests than one batch,
and a store that keeps no spans itself; the run's kept-items table, written as MLflow's own
log_table writes it."""

from __future__ import annotations

import json
import time

import pytest

from reflact.calls.protocol import Reply, Usage
from reflact.running.events import Replied
from reflact.tracking import store as store_module
from reflact.tracking.store import TRACE_BATCH, Store

EXPERIMENT = "traces"


def replied(tag: str, number: int, failed: bool = False) -> Replied:
    messages = [
        {"role": "system", "content": "You are the analyst."},
        {"role": "user", "content": f"Trajectory of {tag} — café"},
    ]
    if failed:
        return Replied(tag, number, messages, None, error="HTTP 500: it broke", ended_at=time.time())
    reply = Reply(
        text=json.dumps({"edits": [{"op": "add", "rule": f"check {tag}"}]}),
        finish_reason="stop",
        usage=Usage(prompt=1200, cached=200, completion=80, reasoning=0),
        latency_s=1.25,
        retries=2,
        structured="json_schema",
        started_at=time.time() - 1.25,
    )
    return Replied(tag, number, messages, reply, cost_usd=0.0031)


@pytest.fixture
def store(tmp_path) -> Store:
    store = Store(f"sqlite:///{tmp_path / 'mlflow.db'}", EXPERIMENT, tmp_path)
    store.create("run", {}, int(time.time() * 1000))
    return store


def traces_of(store: Store) -> dict[tuple[str, str], object]:
    found = store.client.search_traces(locations=[store.experiment_id], run_id=store.run_id, max_results=500)
    keys = [(t.info.tags["reflact.minibatch"], t.info.tags["reflact.request"]) for t in found]
    assert len(keys) == len(set(keys)), "a request has two traces"
    return dict(zip(keys, found, strict=True))


def test_a_trace_holds_the_messages_the_reply_and_the_calls_figures(store):
    store.traces([replied("f0", 1), replied("s0", 2, failed=True)], "gpt-test")
    traces = traces_of(store)
    assert set(traces) == {("f0", "1"), ("s0", "2")}
    done, failed = traces[("f0", "1")], traces[("s0", "2")]
    span = done.data.spans[0]
    assert span.name == "f0" and span.span_type == "LLM"
    assert span.inputs["messages"][1]["content"] == "Trajectory of f0 — café"
    assert json.loads(span.outputs["reply"])["edits"][0]["rule"] == "check f0"
    expected = {
        "model": "gpt-test",
        "request": 1,
        "tokens_prompt": 1200,
        "tokens_cached": 200,
        "tokens_completion": 80,
        "tokens_reasoning": 0,
        "latency_s": 1.25,
        "retries": 2,
        "from_cache": False,
        "finish_reason": "stop",
        "structured_output": "json_schema",
        "cost_usd": 0.0031,
    }
    assert {key: span.attributes[key] for key in expected} == expected
    assert (span.end_time_ns - span.start_time_ns) / 1e9 == pytest.approx(1.25, abs=1e-3)
    assert done.info.state.value == "OK" and done.info.execution_duration == pytest.approx(1250, abs=2)
    assert done.info.token_usage == {"input_tokens": 1200, "output_tokens": 80, "total_tokens": 1280}
    assert failed.info.state.value == "ERROR" and failed.data.spans[0].outputs == {"error": "HTTP 500: it broke"}


def test_a_batch_written_again_replaces_its_traces(store):
    """The tracker retries a batch whose write failed partway: the same requests, the same traces."""
    batch = [replied(f"f{i}", i) for i in range(3)]
    store.traces(batch, "gpt-test")
    store.traces(batch, "gpt-test")
    assert len(traces_of(store)) == 3


def test_more_requests_than_one_batch_are_all_traced_and_linked(store):
    events = [replied(f"f{i}", i + 1) for i in range(TRACE_BATCH + 1)]
    store.traces(events, "gpt-test")
    assert set(traces_of(store)) == {(f"f{i}", str(i + 1)) for i in range(TRACE_BATCH + 1)}


def test_the_traces_of_two_runs_are_their_own(store, tmp_path):
    other = Store(store.uri, EXPERIMENT, tmp_path)
    other.create("other", {}, int(time.time() * 1000))
    store.traces([replied("f0", 1)], "gpt-test")
    other.traces([replied("f0", 1)], "gpt-test")  # the same minibatch and request number
    [mine], [theirs] = traces_of(store).values(), traces_of(other).values()
    assert mine.info.trace_id != theirs.info.trace_id


def test_a_store_without_span_logging_gets_each_trace_through_mlflows_tracer(store, monkeypatch):
    def no_spans(*args, **kwargs):
        raise NotImplementedError

    monkeypatch.setattr(store._tracing, "log_spans", no_spans)
    tracer = []
    monkeypatch.setattr(store_module, "write_trace", lambda *args: tracer.append(args[3].tag))
    store.traces([replied("f0", 1), replied("f1", 2)], "gpt-test")
    assert tracer == ["f0", "f1"]


def test_mlflows_tracer_writes_the_same_figures(store):
    """The slow path (a file store's) as it writes to a store: the same attributes and outcome."""
    from reflact.tracking.store import mlflow_globals_at, write_trace

    with mlflow_globals_at(store.uri):
        write_trace(store.client, store.experiment_id, store.run_id, replied("f0", 1), "gpt-test")
        write_trace(store.client, store.experiment_id, store.run_id, replied("s0", 2, failed=True), "gpt-test")
    traces = traces_of(store)
    span = traces[("f0", "1")].data.spans[0]
    assert span.attributes["tokens_prompt"] == 1200 and span.attributes["retries"] == 2
    assert span.outputs["reply"].startswith('{"edits"')
    assert traces[("s0", "2")].info.state.value == "ERROR"


def test_a_table_is_what_mlflows_log_table_writes(store):
    """Store.log_table skips log_table's three reads of the run: the same file MLflow reads back
    (non-ASCII, quotes and numbers included) and the same tag, which comes with the next write."""
    table = {"minibatch": ["f0", "f0", "s1"], "position": [0, 1, 0], "item": ['{"rule": "café"}', "x/y", ""]}
    tag = store.log_table(table, "kept_items.json")
    store.log_metrics([("edits_kept", 3.0, 0)], int(time.time() * 1000), tag)
    ours = store.run_id
    store.create("theirs", {}, int(time.time() * 1000))
    store.client.log_table(store.run_id, table, "kept_items.json")
    client, experiment = store.client, store.experiment_id
    with store_module.mlflow_globals_at(store.uri):  # load_table searches the runs of MLflow's global store
        mine, theirs = (client.load_table(experiment, "kept_items.json", [run]) for run in (ours, store.run_id))
    assert mine.equals(theirs) and mine.to_dict("list") == table
    listed = [json.loads(client.get_run(run).data.tags["mlflow.loggedArtifacts"]) for run in (ours, store.run_id)]
    assert listed[0] == listed[1] == [{"path": "kept_items.json", "type": "table"}]
    assert client.get_run(ours).data.metrics["edits_kept"] == 3.0
