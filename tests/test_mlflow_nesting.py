"""Nesting under the caller's run (issue 34, item 6): `reflact.reflect(...)` inside `with
mlflow.start_run():` becomes its child; `mlflow.parent_run_id=<id>` on the command line does the
same for a run and for a sweep's parent, in the parent's experiment; a parent that is not there is
one line, rc 2."""

from __future__ import annotations

import mlflow
import pytest
from mlflow import MlflowClient

import reflact
from tests.conftest import ok, output, run_cli, write_dataset

PARENT = "mlflow.parentRunId"


def settings(server, *extra):
    return ["optimizer=compatible", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
            "reflect.minibatch_size=2", *extra]


def test_reflect_inside_an_active_run_is_its_child_in_its_store_and_experiment(tmp_path, server, launch_dir):
    uri = f"sqlite:///{launch_dir / 'outputs' / 'mlflow.db'}"
    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=0)
    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        # its artifacts under tmp_path (MLflow's default is ./mlruns of the current directory)
        experiment = mlflow.create_experiment("my agent", artifact_location=(tmp_path / "art").as_uri())
        mlflow.set_experiment(experiment_id=experiment)
        with mlflow.start_run() as outer:
            done = reflact.reflect(data, overrides=settings(server), run_dir=tmp_path / "run", launch_dir=tmp_path)
            assert mlflow.active_run().info.run_id == outer.info.run_id  # the caller's run is still its own
    finally:
        mlflow.set_tracking_uri(before)
    child = MlflowClient(tracking_uri=uri).get_run(done.mlflow_run_id)
    assert child.data.tags[PARENT] == outer.info.run_id
    assert child.info.experiment_id == experiment and child.info.status == "FINISHED"
    # the caller's store, not the launch dir's default one
    assert not (tmp_path / "outputs" / "mlflow.db").exists()


def test_without_an_active_run_nothing_is_nested(tmp_path, server, launch_dir):
    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=0)
    done = reflact.reflect(data, overrides=settings(server), run_dir=tmp_path / "run", launch_dir=launch_dir)
    client = MlflowClient(tracking_uri=f"sqlite:///{launch_dir / 'outputs' / 'mlflow.db'}")
    assert PARENT not in client.get_run(done.mlflow_run_id).data.tags


@pytest.mark.slow  # a run and a sweep on the command line
def test_parent_run_id_on_the_command_line_nests_a_run_and_a_sweeps_parent(tmp_path, server, launch_dir):
    client = MlflowClient(tracking_uri=f"sqlite:///{launch_dir / 'outputs' / 'mlflow.db'}")
    experiment = client.create_experiment("pipeline", artifact_location=(tmp_path / "art").as_uri())
    outer = client.create_run(experiment).info.run_id
    data = write_dataset(tmp_path / "d", n_fail=4, n_succ=0)
    base = [f"data.dir={data}", *settings(server)]

    ok(run_cli(*base, f"mlflow.parent_run_id={outer}", f"hydra.run.dir={tmp_path / 'run'}", cwd=launch_dir))
    (child,) = client.search_runs([experiment], filter_string=f"tags.`{PARENT}` = '{outer}'")
    assert child.data.tags["reflact.run_dir"] == str(tmp_path / "run") and child.info.status == "FINISHED"

    ok(run_cli("-m", *base, "reflect.edit_budget=1,2", f"mlflow.parent_run_id={outer}", cwd=launch_dir))
    (sweep,) = client.search_runs([experiment], filter_string="tags.`reflact.sweep_parent` = 'true'")
    assert sweep.data.tags[PARENT] == outer
    jobs = client.search_runs([experiment], filter_string=f"tags.`{PARENT}` = '{sweep.info.run_id}'")
    assert len(jobs) == 2 and {j.info.status for j in jobs} == {"FINISHED"}


def test_a_parent_that_is_not_there_is_one_line_and_rc_2(tmp_path, server, launch_dir):
    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=0)
    missing = "0" * 32
    done = run_cli(f"data.dir={data}", *settings(server), f"mlflow.parent_run_id={missing}", cwd=launch_dir)
    assert done.returncode == 2, output(done)
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"reflact: error: mlflow.parent_run_id: no run {missing} in sqlite:///")
    assert server.count == 0
