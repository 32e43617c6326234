"""Provenance on the source traces (issue 34, item 5): each kept edit leaves a `reflact.edit` feedback
on every trace of its minibatch, found by search_traces; a rerun adds none; a task id that is no
trace of the store is left alone."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient

import reflact
from tests.conftest import write_dataset

EDIT = "reflact.edit"


def settings(server, *extra):
    return ["optimizer=compatible", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
            "reflect.minibatch_size=2", "reflect.edit_budget=1", *extra]


def log_agent_traces(uri: str, n: int, artifacts: Path | None = None) -> list[str]:
    """`n` agent runs as MLflow traces (an AGENT root with a CHAT_MODEL span), as users' agents log them."""
    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        # a local store's artifacts under `artifacts` (MLflow's default is ./mlruns of the current directory)
        experiment = mlflow.create_experiment("agents", artifacts.as_uri() if artifacts else None)
        mlflow.set_experiment(experiment_id=experiment)
        ids = []
        for i in range(n):
            with mlflow.start_span(name="agent", span_type="AGENT") as root:
                root.set_inputs({"task": f"refund order {i}"})
                with mlflow.start_span(name="chat", span_type="CHAT_MODEL") as chat:
                    chat.set_inputs({"messages": [{"role": "user", "content": f"order {i}"}]})
                    chat.set_outputs({"content": "done"})
                root.set_outputs({"answer": "done"})
            ids.append(root.trace_id)
        mlflow.flush_trace_async_logging()
        client = MlflowClient(tracking_uri=uri)
        assert {t.info.trace_id for t in client.search_traces(locations=[experiment])} == set(ids)
        return ids
    finally:
        mlflow.set_tracking_uri(before)


@pytest.fixture
def traced(tmp_path, launch_dir):
    """A dataset folder whose task ids are the ids of four logged traces, one more id that looks like
    a trace but is none, and one plain id: all failures."""
    uri = f"sqlite:///{launch_dir / 'outputs' / 'mlflow.db'}"
    ids = log_agent_traces(uri, 4, tmp_path / "art")
    return dataset_with_ids(tmp_path / "d", [*ids, "tr-" + "0" * 32, "plain_id"]), uri, ids


def dataset_with_ids(folder, ids: list[str]):
    """A dataset folder of failures whose task ids are `ids` (as the traces importer names them)."""
    data = write_dataset(folder, n_fail=len(ids), n_succ=0)
    results = [json.loads(line) for line in (data / "results.jsonl").read_text().splitlines()]
    renamed = {r["id"]: new for r, new in zip(sorted(results, key=lambda r: r["id"]), ids, strict=True)}
    for row in results:
        (data / "predictions" / row["id"]).rename(data / "predictions" / renamed[row["id"]])
        row["id"] = renamed[row["id"]]
    (data / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results))
    return data


def feedback_on(client: MlflowClient, trace_id: str) -> list:
    return [a for a in client.get_trace(trace_id).info.assessments if a.name == EDIT]


@pytest.mark.slow  # three runs
def test_each_trace_of_a_kept_edits_minibatch_gets_one_feedback_and_a_rerun_adds_none(
    tmp_path, server, launch_dir, traced
):
    data, uri, ids = traced
    done = reflact.reflect(data, overrides=settings(server), run_dir=tmp_path / "run", launch_dir=launch_dir)
    assert done.status == "FINISHED"
    client = MlflowClient(tracking_uri=uri)
    kept = {tag: p for tag, p in done.patches.items() if p["patch"]["edits"]}
    by_trace = {i: [(tag, p["patch"]["edits"][0]) for tag, p in kept.items() if i in p["trajectory_ids"]] for i in ids}
    for trace_id, expected in by_trace.items():
        (feedback,) = feedback_on(client, trace_id)
        ((tag, edit),) = expected
        assert feedback.source.source_type == "CODE" and feedback.source.source_id == "reflact"
        assert json.loads(feedback.value) == edit
        assert feedback.metadata["run_id"] == done.mlflow_run_id
        assert (feedback.metadata["minibatch"], feedback.metadata["edit_index"]) == (tag, "0")
    # the traces that caused edits, as a user finds them
    experiment = client.get_experiment_by_name("agents").experiment_id
    found = client.search_traces(locations=[experiment], filter_string=f"feedback.`{EDIT}` IS NOT NULL")
    assert {t.info.trace_id for t in found} == set(ids)

    # the same run dir again, and the same settings in another run dir: no duplicate anywhere
    for run_dir in ("run", "run2"):
        again = reflact.reflect(data, overrides=settings(server), run_dir=tmp_path / run_dir, launch_dir=launch_dir)
        assert again.status == "FINISHED"
    assert all(len(feedback_on(client, trace_id)) == 1 for trace_id in ids)


def test_no_feedback_is_written_when_turned_off(tmp_path, server, launch_dir, traced):
    data, uri, ids = traced
    done = reflact.reflect(data, overrides=settings(server, "mlflow.edit_feedback=false"),
                           run_dir=tmp_path / "run", launch_dir=launch_dir)
    assert done.status == "FINISHED"
    client = MlflowClient(tracking_uri=uri)
    assert all(feedback_on(client, trace_id) == [] for trace_id in ids)
