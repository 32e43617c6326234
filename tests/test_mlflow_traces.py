"""data.source=mlflow and python -m reflact.import_traces: scored traces written with MLflow's own
tracing API into a sqlite store (and a real `mlflow server`), read back as the run's input:
selection, labels and the pass rule, paging, the mapping, the fingerprint, the importer's round
trip, and every bad input as one line naming the key."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import reflact
from reflact.core.errors import UserError
from reflact.inputs import traces as traces_module
from tests.conftest import file_bytes, run_cli, start_mlflow_server, stop

SKILL = "# Refund skill\n\n- Amounts passed to refund() are in cents.\n"
EXPERIMENT = "agent"


@pytest.fixture
def store(tmp_path, migrated_store, monkeypatch):
    """A sqlite store in tmp_path, the experiment `agent` active for the traces the test writes."""
    import mlflow

    monkeypatch.setenv("MLFLOW_ENABLE_ASYNC_TRACE_LOGGING", "false")
    path = tmp_path / "traces.db"
    shutil.copy(migrated_store, path)
    uri = f"sqlite:///{path}"
    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(EXPERIMENT)
    yield uri
    mlflow.set_tracking_uri(before)


def agent_trace(question: str, *, system: str = SKILL, tool: bool = True, nested: bool = False, tags=None) -> str:
    """One agent run as an instrumented agent records it: AGENT root, CHAT_MODEL turns, a TOOL call."""
    import mlflow
    from mlflow.entities import SpanType

    with mlflow.start_span("agent", span_type=SpanType.AGENT) as root:
        root.set_inputs({"question": question})
        if tags:
            mlflow.update_current_trace(tags=tags)
        call = {"id": "c1", "type": "function", "function": {"name": "refund", "arguments": '{"cents": 500}'}}
        first = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        asked = {"role": "assistant", "content": "Refunding.", "tool_calls": [call]}
        # the reply as the client logs it has fields the agent leaves out when it sends it back
        _chat(first, {"choices": [{"message": {**asked, "refusal": None, "annotations": []}}]}, nested)
        if tool:
            with mlflow.start_span("refund", span_type=SpanType.TOOL) as span:
                span.set_inputs({"cents": 500})
                span.set_outputs({"status": "refunded"})
        second = [*first, asked, {"role": "tool", "tool_call_id": "c1", "content": '{"status": "refunded"}'}]
        _chat(second, {"choices": [{"message": {"role": "assistant", "content": f"Done: {question}"}}]}, nested)
        root.set_outputs("done")
    return root.trace_id


def _chat(messages: list, reply: dict, nested: bool) -> None:
    """A CHAT_MODEL span; `nested`: inside another, as a framework's span wraps the client's own."""
    import mlflow
    from mlflow.entities import SpanType

    with mlflow.start_span("ChatModel", span_type=SpanType.CHAT_MODEL) as outer:
        outer.set_inputs({"messages": messages})
        if nested:
            with mlflow.start_span("openai", span_type=SpanType.CHAT_MODEL) as inner:
                inner.set_inputs({"messages": messages, "model": "gpt"})
                inner.set_outputs(reply)
        outer.set_outputs(reply)


def feedback(trace_id: str, value, rationale: str | None = None, name: str = "correct") -> None:
    import mlflow
    from mlflow.entities import AssessmentSource

    source = AssessmentSource(source_type="HUMAN", source_id="reviewer")
    mlflow.log_feedback(trace_id=trace_id, name=name, value=value, rationale=rationale, source=source)


def settings(uri: str, *extra: str) -> list[str]:
    return ["data.source=mlflow", f"data.mlflow.experiment={EXPERIMENT}", "data.mlflow.label=correct",
            f"data.mlflow.tracking_uri={uri}", *extra]


def selected(uri: str, *extra: str):
    from reflact.api import compose
    from reflact.config import validate
    from reflact.inputs.source import load_input

    cfg = validate(compose(settings(uri, *extra)))
    return load_input(cfg.data, cfg.mlflow, cfg.reflect, Path.cwd())


def test_the_label_and_pass_rule_select_the_traces_and_the_rest_are_counted_unlabelled(store, caplog):
    verdicts = {"yes": True, "no": False, True: True, False: False, "1": True, "0": False, 0.7: True, 0.2: False}
    ids = {}
    for value, passed in verdicts.items():
        ids[agent_trace(f"order {value!r}")] = 1.0 if passed else 0.0
        feedback(list(ids)[-1], value)
    unfit, bare, other = agent_trace("order ?"), agent_trace("order -"), agent_trace("order other")
    feedback(unfit, "maybe")
    feedback(other, True, name="polite")  # another feedback is no label
    with caplog.at_level(logging.WARNING, logger="reflact"):
        dataset = selected(store)
    assert {r.id: r.hard for r in dataset.results} == ids
    assert bare not in {r.id for r in dataset.results}
    assert (dataset.origin.found, dataset.origin.unlabelled) == (11, 3)
    assert "fits no pass rule" in caplog.text and "'maybe'" in caplog.text and unfit in caplog.text
    # the threshold is the user's: at 0.8, a 0.7 score fails too
    assert sum(r.hard for r in selected(store, "data.mlflow.pass_threshold=0.8").results) == 3


def test_the_filter_is_passed_to_mlflow_and_max_traces_keeps_the_newest(store):
    kept = [agent_trace(f"order {n}", tags={"team": "refunds"}) for n in range(3)]
    left = agent_trace("order x", tags={"team": "billing"})
    for trace_id in [*kept, left]:
        feedback(trace_id, False)
    assert {r.id for r in selected(store, "data.mlflow.filter=\"tags.team = 'refunds'\"").results} == set(kept)
    assert {r.id for r in selected(store, "data.mlflow.max_traces=2").results} == {kept[2], left}


def test_several_experiments_are_read_by_name_or_id(store):
    import mlflow

    first = labelled(1)
    other = mlflow.set_experiment("other-agent").experiment_id
    second = labelled(1)
    both = selected(store, f"data.mlflow.experiment=[{EXPERIMENT},{other}]")
    assert {r.id for r in both.results} == {*first, *second}
    assert both.origin.experiments == (EXPERIMENT, other)


def test_paging_goes_past_one_page_and_fetches_the_spans_of_each(store, monkeypatch):
    ids = [agent_trace(f"order {n}") for n in range(7)]
    for n, trace_id in enumerate(ids):
        if n != 3:
            feedback(trace_id, n % 2 == 0)
    monkeypatch.setattr(traces_module, "PAGE", 2)
    dataset = selected(store)
    assert sorted(r.id for r in dataset.results) == sorted(i for n, i in enumerate(ids) if n != 3)
    assert dataset.origin.found == 7 and dataset.origin.unlabelled == 1
    assert all(dataset.conversations[r.id] for r in dataset.results)
    assert len(selected(store, "data.mlflow.max_traces=5").results) == 5


def test_a_trace_maps_to_task_conversation_tool_calls_reason_and_reference(store):
    import mlflow

    trace_id = agent_trace("Refund order 17", nested=True)
    feedback(trace_id, "no", rationale="refunded 500 dollars, not cents")
    mlflow.log_expectation(trace_id=trace_id, name="expected_response", value="Refund of 5.00 USD")
    dataset = selected(store)
    assert dataset.skill == SKILL
    [result] = dataset.results
    assert result.fields == {
        "id": trace_id, "hard": 0.0, "task_description": "Refund order 17", "n_turns": 2, "label": "no",
        "fail_reason": "refunded 500 dollars, not cents", "reference_text": "Refund of 5.00 USD",
    }
    # the nested chat spans count once; the TOOL span is the call, not the messages repeating it
    assert dataset.conversations[trace_id] == [
        {"role": "user", "content": "Refund order 17"},
        {"role": "assistant", "content": "Refunding."},
        {"type": "tool_call", "cmd": 'refund({"cents": 500})', "obs": '{"status": "refunded"}'},
        {"role": "assistant", "content": "Done: Refund order 17"},
    ]


def test_without_tool_spans_the_chat_messages_give_the_tool_calls_and_a_other_system_prompt_is_kept(store):
    plain = agent_trace("Refund order 18", tool=False)
    other = agent_trace("Refund order 19", tool=False, system="Another prompt")
    third = agent_trace("Refund order 20", tool=False)
    for trace_id in (plain, other, third):
        feedback(trace_id, True)
    dataset = selected(store)
    assert dataset.skill == SKILL  # the system message most traces began with
    assert dataset.conversations[plain][1:3] == [
        {"role": "assistant", "content": "Refunding."},
        {"type": "tool_call", "cmd": 'refund({"cents": 500})', "obs": '{"status": "refunded"}'},
    ]
    fields = {r.id: r.fields for r in dataset.results}
    assert fields[other]["target_system_prompt"] == "Another prompt" and "target_system_prompt" not in fields[plain]


def dry_run(tmp_path, name: str, overrides: list[str], data=None):
    return reflact.reflect(data, overrides=["optimizer=dry_run", "reflect.minibatch_size=2", *overrides],
                           run_dir=tmp_path / name, launch_dir=tmp_path)


def test_the_importer_writes_a_folder_whose_run_builds_byte_identical_prompts(store, tmp_path):
    import mlflow

    for n in range(5):
        trace_id = agent_trace(f"Refund order {n}", nested=n == 2, tool=n != 3)
        feedback(trace_id, n % 2 == 1, rationale=f"reason {n}")
        mlflow.log_expectation(trace_id=trace_id, name="expected_response", value=f"refund {n}")
    from reflact.import_traces import main

    args = [str(tmp_path / "folder"), "--experiment", EXPERIMENT, "--label", "correct", "--tracking-uri", store]
    assert main(args) == 0
    assert sorted(p.name for p in (tmp_path / "folder").iterdir()) == ["predictions", "results.jsonl", "skill.md"]
    over_traces = dry_run(tmp_path, "traces", settings(store, "mlflow.enabled=false"))
    over_folder = dry_run(tmp_path, "folder_run", ["mlflow.enabled=false"], tmp_path / "folder")
    prompts = file_bytes(over_traces.run_dir / "calls")
    assert len([p for p in prompts if "user" in p]) == 3
    assert prompts == file_bytes(over_folder.run_dir / "calls")


def test_the_importer_says_a_mistake_in_one_line_and_writes_nothing(store, tmp_path, capsys):
    from reflact.import_traces import main

    agent_trace("no label")
    with pytest.raises(SystemExit) as ended:
        main([str(tmp_path / "out"), "--experiment", EXPERIMENT, "--label", "correct", "--tracking-uri", store])
    assert ended.value.code == 2 and not (tmp_path / "out").exists()
    assert capsys.readouterr().err.strip() == (
        "reflact: error: data.mlflow.label: no traces left to read: 1 found, 1 without a feedback 'correct' "
        "that says pass or fail"
    )


def test_the_same_traces_resume_and_changed_feedback_redoes_the_patches(store, tmp_path, server):
    ids = [agent_trace(f"Refund order {n}") for n in range(4)]
    for n, trace_id in enumerate(ids):
        feedback(trace_id, n < 2, rationale=f"reason {n}")
    overrides = settings(store, "optimizer=compatible", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
                         "optimizer.cache=off", "reflect.minibatch_size=2", "mlflow.enabled=false")
    run = lambda: reflact.reflect(overrides=overrides, run_dir=tmp_path / "run", launch_dir=tmp_path)  # noqa: E731
    assert run().summary["counts"]["minibatches_done"] == 2 and len(server.requests) == 2
    assert run().summary["counts"]["minibatches_reused"] == 2 and len(server.requests) == 2
    feedback(ids[0], 0.9)  # the same verdict (a pass), another value: the label changed, the prompts did not
    assert run().summary["counts"]["minibatches_done"] == 2 and len(server.requests) == 4
    agent_trace("Refund order 9")  # a new trace without the label changes nothing
    assert run().summary["counts"]["minibatches_reused"] == 2 and len(server.requests) == 4


def test_the_run_logs_the_traces_as_its_dataset_input_naming_experiment_and_filter(store, tmp_path, launch_dir):
    import mlflow

    labelled(3)
    agent_trace("no label")
    overrides = ["optimizer=dry_run", *settings(store, "data.mlflow.filter=\"trace.status = 'OK'\"")]
    done = reflact.reflect(overrides=overrides, run_dir=tmp_path / "run", launch_dir=launch_dir)
    logged = mlflow.MlflowClient(f"sqlite:///{launch_dir / 'outputs' / 'mlflow.db'}").get_run(done.mlflow_run_id)
    [dataset] = [d.dataset for d in logged.inputs.dataset_inputs]
    assert dataset.source_type == "mlflow_traces" and dataset.name == f"traces:{EXPERIMENT}"
    source = {"tracking_uri": store, "experiment": [EXPERIMENT], "filter": "trace.status = 'OK'"}
    assert json.loads(dataset.source) == source
    assert json.loads(dataset.profile) == {"results": 3, "failures": 3, "successes": 0, "skipped": 0, "found": 4,
                                           "unlabelled": 1}
    assert done.summary["counts"]["unlabelled"] == 1 and logged.data.metrics["unlabelled"] == 1
    assert dataset.digest == selected(store).selection


# ---------------------------------------------------------------- bad input


def labelled(n: int = 1, value=False, **kwargs) -> list[str]:
    ids = [agent_trace(f"order {i}", **kwargs) for i in range(n)]
    for trace_id in ids:
        feedback(trace_id, value)
    return ids


@pytest.mark.parametrize(
    ("prepare", "extra", "match"),
    [
        (lambda: labelled(), ["data.mlflow.experiment=nowhere"],
         r"^data\.mlflow\.experiment: no experiment named 'nowhere'"),
        (lambda: labelled(), ["data.mlflow.filter=\"tags.x === 1\""], r"^data\.mlflow\.filter: MLflow refuses it: "),
        (lambda: agent_trace("order"), [], r"^data\.mlflow\.label: no traces left to read: 1 found, 1 without"),
        (lambda: feedback(agent_trace("order"), "maybe"), [], r"^data\.mlflow\.label: no traces left"),
        (lambda: labelled(value=True), ["reflect.failure_only=true"],
         r"^data\.mlflow\.label: every selected trace passes"),
        (lambda: labelled(), ["data.max_file_mb=0.001"], r"^data\.max_file_mb: trace tr-\w+ is [\d.]+ MB, over the"),
        (lambda: labelled(), ["data.mlflow.tracking_uri=file:///tmp/mlruns"],
         r"^data\.mlflow\.tracking_uri: .* a file store"),
        (lambda: None, ["data.mlflow.tracking_uri=sqlite:////nowhere/mlflow.db"],
         r"^data\.mlflow\.tracking_uri: no store at /nowhere/mlflow\.db"),
        (lambda: None, ["data.mlflow.label=''"], r"^data\.mlflow\.label: name the feedback"),
        (lambda: None, ["data.mlflow.experiment=null"], r"^data\.mlflow\.experiment: name the experiment"),
        (lambda: None, ["data.mlflow.tracking_uri=http://u:p@127.0.0.1:1"], r"^data\.mlflow\.tracking_uri carries"),
    ],
    ids=["experiment", "filter", "unlabelled", "unfit", "only-successes", "too-large", "file-store", "no-store",
         "no-label", "no-experiment", "credentials"],
)
def test_bad_input_is_one_line_naming_the_key(store, tmp_path, prepare, extra, match):
    prepare()
    with pytest.raises(UserError, match=match) as caught:
        dry_run(tmp_path, "run", settings(store, "mlflow.enabled=false", *extra))
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "run").exists()  # the run dir made for it goes again


def test_a_trace_without_a_chat_model_span_is_refused_naming_the_filter(store, tmp_path):
    import mlflow

    with mlflow.start_span("agent") as root:
        root.set_inputs({"question": "no model"})
    feedback(root.trace_id, False)
    with pytest.raises(UserError, match=r"^data\.mlflow\.filter: trace tr-\w+ has no CHAT_MODEL span") as caught:
        dry_run(tmp_path, "run", settings(store, "mlflow.enabled=false"))
    assert "span.type = 'CHAT_MODEL'" in str(caught.value)


def test_a_store_that_does_not_answer_is_asked_again_then_one_line(store, tmp_path, monkeypatch, caplog):
    import socket

    with socket.socket() as sock:  # a loopback port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    import mlflow

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # MLflow's own retries, then reflact's
    asked = []
    real = mlflow.MlflowClient.get_experiment_by_name
    monkeypatch.setattr(mlflow.MlflowClient, "get_experiment_by_name", lambda *a: asked.append(1) or real(*a))
    gone = f"data.mlflow.tracking_uri=http://127.0.0.1:{port}"
    with caplog.at_level(logging.INFO, logger="reflact"), pytest.raises(
            UserError, match=r"^data\.mlflow\.tracking_uri: the store at http://127\.0\.0\.1:\d+ did not"):
        dry_run(tmp_path, "run", settings(store, "mlflow.enabled=false", gone, "mlflow.deadline_s=1.5"))
    assert len(asked) >= 2  # asked again, and said so once
    assert caplog.text.count("did not answer") == 1 and "asking again for up to 1.5 s" in caplog.text


def test_on_the_command_line_a_bad_input_exits_2_and_leaves_no_mlflow_run(store, tmp_path, launch_dir):
    labelled()
    proc = run_cli(*settings(store, "data.mlflow.experiment=nowhere", "optimizer=dry_run"), cwd=launch_dir)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "error" in line]
    assert lines == ["reflact: error: data.mlflow.experiment: no experiment named 'nowhere' in " + store]
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{launch_dir / 'outputs' / 'mlflow.db'}")
    assert not client.search_runs([e.experiment_id for e in client.search_experiments()])


@pytest.mark.slow
def test_traces_on_a_real_mlflow_server_are_read_page_by_page(tmp_path, migrated_store, monkeypatch):
    import mlflow

    monkeypatch.setenv("MLFLOW_ENABLE_ASYNC_TRACE_LOGGING", "false")
    proc, url = start_mlflow_server(tmp_path, migrated_store)
    before = mlflow.get_tracking_uri()
    try:
        mlflow.set_tracking_uri(url)
        mlflow.set_experiment(EXPERIMENT)
        ids = labelled(5)
        feedback(ids[0], True)  # the newer feedback decides
        monkeypatch.setattr(traces_module, "PAGE", 2)
        dataset = selected(url)
        assert {r.id: r.hard for r in dataset.results} == {i: float(i == ids[0]) for i in ids}
        assert dataset.conversations[ids[1]][2]["type"] == "tool_call"
    finally:
        mlflow.set_tracking_uri(before)
        stop(proc)


def test_the_docs_example_logs_traces_a_run_reads(tmp_path):
    """docs/mlflow.md, "From your MLflow traces": the example script, then the run (a dry run here)."""
    from tests.conftest import PROJECT, ok

    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    env.pop("MLFLOW_TRACKING_URI", None)
    script = subprocess.run([sys.executable, str(PROJECT / "examples" / "mlflow_traces.py")], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert script.returncode == 0, script.stderr[-2000:]
    shown = ok(run_cli("data.source=mlflow", "data.mlflow.experiment=support-agent", "data.mlflow.label=correct",
                       "optimizer=dry_run", cwd=tmp_path))
    assert "read 5 traces from MLflow: 5 selected (3 failures, 2 successes), 0 unlabelled skipped" in shown
