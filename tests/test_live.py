"""MLflow as a live, truthful view of each run: RUNNING from the first call with each minibatch as it
settles, the true end status and times, one active run per run dir whatever moment a process died
at, and sweeps whose parent ends with its children.

The runs go through the real entry point (`python -m reflact.run` in a subprocess) against the
loopback optimizer server, whose `Gate` script answers the first requests at once and holds the
rest until the test opens it, so the test can look at the store while calls are in flight.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from reflact.testing.optimizer_server import OptimizerServer, Response
from tests.conftest import run_cli, start_mlflow_server, stop, write_dataset

EXPERIMENT = "reflact"


class Gate:
    """Answers the first `free` requests at once and holds the others until `open()`; records when
    each request arrived and was answered (epoch seconds)."""

    def __init__(self, free: int) -> None:
        self.free = free
        self.opened = threading.Event()
        self.arrived: list[float] = []
        self.answered: list[float] = []

    def __call__(self, request: dict, number: int):
        self.arrived.append(time.time())
        if number > self.free:
            self.opened.wait(120)
        self.answered.append(time.time())
        return None  # the server's default, valid reply

    def open(self) -> None:
        self.opened.set()


def start(args: list[str], cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    env.pop("OPENAI_API_KEY", None)
    return subprocess.Popen([sys.executable, "-m", "reflact.run", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def run_args(data: Path, server: OptimizerServer, run_dir: Path, *extra: str) -> list[str]:
    return [f"data.dir={data}", "optimizer=compatible", f"optimizer.base_url={server.base_url}",
            "optimizer.model=test", "optimizer.cache=off", "reflect.minibatch_size=1", "reflect.workers=2",
            "optimizer.retry.initial_wait_s=0.01", f"hydra.run.dir={run_dir}", *extra]


def client_for(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def runs_of(uri: str, run_dir: Path | None = None, deleted: bool = False) -> list:
    """The experiment's runs (of one run dir), active ones unless `deleted`."""
    from mlflow.entities import ViewType

    client = client_for(uri)
    exp = client.get_experiment_by_name(EXPERIMENT)
    if exp is None:
        return []
    view = ViewType.ALL if deleted else ViewType.ACTIVE_ONLY
    runs = client.search_runs([exp.experiment_id], run_view_type=view, max_results=1000)
    return [r for r in runs if run_dir is None or r.data.tags.get("reflact.run_dir") == str(run_dir)]


def wait_for(condition, timeout_s: float = 90.0, what: str = "the condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.25)
    pytest.fail(f"timed out waiting for {what}")


def running_with_a_minibatch(uri: str, run_dir: Path):
    runs = runs_of(uri, run_dir)
    if len(runs) == 1 and runs[0].info.status == "RUNNING" and "minibatch/kept" in runs[0].data.metrics:
        return runs[0]
    return None


def finish(proc: subprocess.Popen, timeout_s: float = 120) -> subprocess.CompletedProcess:
    out, err = proc.communicate(timeout=timeout_s)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


# ---------------------------------------------------------------------------------------------
# 1. live: RUNNING while calls are held, then FINISHED with the stage's real times


@pytest.fixture(scope="module", params=["sqlite", pytest.param("server", marks=pytest.mark.slow)])
def held_run(request, tmp_path_factory, migrated_store):
    root = tmp_path_factory.mktemp(f"live-{request.param}")
    launch = root / "launch"
    (launch / "outputs").mkdir(parents=True)
    data = write_dataset(root / "data", n_fail=6, n_succ=0)
    proc_server = None
    if request.param == "sqlite":
        uri = f"sqlite:///{launch / 'outputs' / 'mlflow.db'}"
        import shutil

        shutil.copy(migrated_store, launch / "outputs" / "mlflow.db")
    else:
        proc_server, uri = start_mlflow_server(root, migrated_store)
    gate = Gate(free=2)
    run_dir = launch / "run"
    try:
        with OptimizerServer(script=gate) as server:
            started = time.time()
            proc = start(run_args(data, server, run_dir, f"mlflow.tracking_uri={uri}"), launch)
            live = wait_for(lambda: running_with_a_minibatch(uri, run_dir), what="a RUNNING run with a minibatch")
            held_requests = server.count
            gate.open()
            done = finish(proc)
            ended = time.time()
        final = runs_of(uri, run_dir)
        history = client_for(uri).get_metric_history(final[0].info.run_id, "minibatch/kept") if final else []
        traces = client_for(uri).search_traces(locations=[final[0].info.experiment_id], run_id=final[0].info.run_id,
                                               max_results=100) if final else []
    finally:
        if proc_server is not None:
            stop(proc_server)
    return {"live": live, "held_requests": held_requests, "done": done, "final": final, "gate": gate,
            "started": started, "ended": ended, "history": history, "traces": traces}


def test_the_run_is_running_with_a_minibatch_while_later_calls_are_held(held_run):
    live = held_run["live"]
    assert live.info.status == "RUNNING" and live.info.end_time in (None, 0)
    assert live.data.metrics["minibatches"] == 6
    assert 1 <= live.data.metrics["minibatches_ended"] < 6  # some minibatches, not all
    assert 0 < live.data.metrics["progress"] < 1
    assert held_run["held_requests"] < 6  # calls were still held by the server when it was looked at


def test_the_run_ends_finished_with_a_duration_covering_the_stage(held_run):
    done, gate = held_run["done"], held_run["gate"]
    assert done.returncode == 0, done.stderr[-3000:]
    [run] = held_run["final"]
    assert run.info.status == "FINISHED"
    start_s, end_s = run.info.start_time / 1000, run.info.end_time / 1000
    assert held_run["started"] - 1 <= start_s <= min(gate.arrived)  # the run's real start, before the first call
    assert max(gate.answered) <= end_s <= held_run["ended"] + 1  # the real end, after the last reply
    assert run.data.metrics["minibatches_done"] == 6 and run.data.metrics["progress"] == 1


def test_each_minibatch_is_a_step_of_its_series(held_run):
    assert sorted(m.step for m in held_run["history"]) == list(range(6))
    assert all(m.value == 4 for m in held_run["history"])  # L=4 kept of each reply


def test_each_call_is_a_trace_linked_to_the_run(held_run):
    traces = held_run["traces"]
    assert len(traces) == 6
    for trace in traces:
        span = trace.data.spans[0]
        assert span.inputs["messages"][1]["content"].count("### Trajectory 1 of 1") == 1
        assert "reply" in span.outputs and span.attributes["tokens_prompt"] == 100


# ---------------------------------------------------------------------------------------------
# 2. true status: a run whose calls all fail is FAILED and exits 1


def test_a_run_whose_calls_all_fail_exits_1_and_is_failed(tmp_path, launch_dir):
    data = write_dataset(tmp_path / "data", n_fail=3, n_succ=2)
    # a 500 (a 404 before any reply is a dead endpoint's, with its own line: tests/test_endpoint.py)
    with OptimizerServer(script=lambda r, n: Response(status=500, body={"error": {"message": "it broke"}})) as s:
        done = run_cli(*run_args(data, s, tmp_path / "run", "optimizer.retry.max_attempts=1"), cwd=launch_dir)
    assert done.returncode == 1, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("reflact:")]
    assert len(errors) == 1 and "no minibatch produced a patch" in errors[0] and "optimizer.base_url" in errors[0]
    assert "Traceback" not in done.stderr
    [run] = runs_of(f"sqlite:///{launch_dir / 'outputs' / 'mlflow.db'}", tmp_path / "run")
    assert run.info.status == "FAILED" and run.data.metrics["minibatches_failed"] == 5


@pytest.mark.slow
def test_a_failed_minibatch_fails_the_run_only_when_failures_are_not_allowed(tmp_path, launch_dir):
    data = write_dataset(tmp_path / "data", n_fail=3, n_succ=0)
    uri = f"sqlite:///{launch_dir / 'outputs' / 'mlflow.db'}"
    fail_first = lambda r, n: Response(status=500, body={}) if n == 1 else None  # noqa: E731
    for allowed, code, status in (("true", 0, "FINISHED"), ("false", 1, "FAILED")):
        run_dir = tmp_path / f"run-{allowed}"
        with OptimizerServer(script=fail_first) as s:
            done = run_cli(*run_args(data, s, run_dir, "optimizer.retry.max_attempts=1", "reflect.workers=1",
                                     f"reflect.allow_failed_minibatches={allowed}"), cwd=launch_dir)
        assert done.returncode == code, done.stderr[-2000:]
        [run] = runs_of(uri, run_dir)
        assert run.info.status == status and run.data.metrics["minibatches_failed"] == 1


# ---------------------------------------------------------------------------------------------
# 3. killed at any moment, then rerun: one active run per run dir, none RUNNING


# start: Python and Hydra starting; calls: requests in flight, the MLflow run not yet open (opening
# the store takes seconds); running: the run RUNNING with a minibatch; ending: the last replies in
MOMENTS = [("SIGKILL", "start"), ("SIGKILL", "calls"), ("SIGINT", "calls"), ("SIGKILL", "running"),
           ("SIGINT", "running"), ("SIGTERM", "running"), ("SIGKILL", "ending")]


@pytest.mark.slow
@pytest.mark.parametrize("sig,moment", MOMENTS)
def test_killed_then_rerun_leaves_one_active_run_and_none_running(tmp_path, launch_dir, sig, moment):
    data = write_dataset(tmp_path / "data", n_fail=6, n_succ=0)
    uri = f"sqlite:///{launch_dir / 'outputs' / 'mlflow.db'}"
    run_dir = tmp_path / "run"
    gate = Gate(free=2)
    with OptimizerServer(script=gate) as server:
        proc = start(run_args(data, server, run_dir), launch_dir)
        if moment == "start":
            time.sleep(0.3)
        elif moment == "calls":
            wait_for(lambda: server.count == 4, what="two answered and two held requests")
        else:
            wait_for(lambda: running_with_a_minibatch(uri, run_dir), what="a RUNNING run")
        if moment == "ending":
            gate.open()
            wait_for(lambda: len(gate.answered) == 6, what="the last replies")
        requests_at_kill = server.count
        proc.send_signal(getattr(signal, sig))
        done = finish(proc)
        if moment != "ending":
            assert server.count == requests_at_kill  # no request started after the signal
        gate.open()
        expected = {"SIGKILL": -9, "SIGINT": 130, "SIGTERM": 143}[sig]
        assert done.returncode in ((expected, 0) if moment == "ending" else (expected,)), done.stderr[-3000:]
        if sig != "SIGKILL":
            lines = [line for line in done.stderr.splitlines() if line.startswith("reflact:")]
            assert len(lines) == 1 and str(run_dir) in lines[0] and "Traceback" not in done.stderr, done.stderr
            [killed] = runs_of(uri, run_dir)
            assert killed.info.status == "KILLED"
        rerun = run_cli(*run_args(data, server, run_dir), cwd=launch_dir)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    active = runs_of(uri, run_dir)
    assert len(active) == 1 and active[0].info.status == "FINISHED"
    assert active[0].data.metrics["minibatches_done"] + active[0].data.metrics.get("minibatches_reused", 0) == 6
    assert not [r.info.run_id for r in runs_of(uri, deleted=True) if r.info.status == "RUNNING"]


def test_a_rerun_that_replaces_the_mlflow_run_keeps_every_request_traced(tmp_path, launch_dir):
    """The rerun's MLflow run replaces the first one, whose traces go with it: the requests that made
    the reused minibatches' patches are traced again from the run dir's records, with those made now,
    whether the rerun redoes a failed minibatch or only runs under another setting."""
    data = write_dataset(tmp_path / "data", n_fail=3, n_succ=0)
    uri = f"sqlite:///{launch_dir / 'outputs' / 'mlflow.db'}"
    run_dir = tmp_path / "run"
    fail_first = lambda r, n: Response(status=500, body={}) if n == 1 else None  # noqa: E731
    with OptimizerServer(script=fail_first) as server:
        args = run_args(data, server, run_dir, "optimizer.retry.max_attempts=1", "reflect.workers=1")
        first = ["ERROR", "OK", "OK"]  # the first request failed (one attempt allowed)
        for extra, statuses in (((), first), ((), ["OK"] * 3), (("reflect.workers=2",), ["OK"] * 3)):
            done = run_cli(*args, *extra, cwd=launch_dir)  # the first run; the failed minibatch redone; no call
            assert done.returncode == 0, done.stderr[-3000:]
            [run] = runs_of(uri, run_dir)
            traces = client_for(uri).search_traces(locations=[run.info.experiment_id], run_id=run.info.run_id)
            traced = sorted((t.info.tags["reflact.minibatch"], t.data.spans[0].status.status_code) for t in traces)
            assert traced == [(f"minibatch_fail_00{i}", status) for i, status in enumerate(statuses)]
        assert server.count == 4  # the last rerun asked nothing


def test_a_rerun_of_a_run_dir_with_quotes_in_its_path_replaces_its_run(tmp_path, launch_dir, server):
    """MLflow's filter strings cannot escape a quote: a run dir named like `o'brien "tests"` is still
    found again by its rerun, whose MLflow run replaces the first one."""
    data = write_dataset(tmp_path / "data", n_fail=2, n_succ=0)
    uri = f"sqlite:///{launch_dir / 'outputs' / 'mlflow.db'}"
    for name in ("o'brien", 'o\'brien "tests"'):
        run_dir = tmp_path / name
        for budget in (1, 2):  # other settings: the rerun makes its own MLflow run
            quoted = "'" + str(run_dir).replace("'", "\\'") + "'"  # Hydra's quoting of an override's value
            done = run_cli(*run_args(data, server, quoted, f"reflect.edit_budget={budget}"), cwd=launch_dir)
            assert done.returncode == 0, done.stderr[-3000:]
        [active] = runs_of(uri, run_dir)
        assert active.info.status == "FINISHED" and active.data.metrics["L"] == 2


# ---------------------------------------------------------------------------------------------
# 4. sweeps: the parent ends with its children, and a sweep dir keeps its fixed settings


def sweep_parents(uri: str) -> list:
    return [r for r in runs_of(uri) if r.data.tags.get("reflact.sweep_parent") == "true"]


@pytest.mark.slow
def test_a_sweep_aborted_by_a_failed_job_ends_its_parent_failed(tmp_path, launch_dir):
    data = write_dataset(tmp_path / "data", n_fail=2, n_succ=0)
    uri = f"sqlite:///{launch_dir / 'outputs' / 'mlflow.db'}"
    # every request of the L=2 job is refused: that job fails, which aborts the sweep
    refuse_l2 = lambda r, n: Response(status=404, body={}) if "L=2" in r["messages"][1]["content"] else None  # noqa
    with OptimizerServer(script=refuse_l2) as server:
        done = run_cli("-m", *run_args(data, server, tmp_path / "unused", "optimizer.retry.max_attempts=1"),
                       "name=abort", "reflect.edit_budget=1,2", cwd=launch_dir)
    assert done.returncode == 1, done.stderr[-3000:]
    [parent] = sweep_parents(uri)
    assert parent.info.status == "FAILED" and parent.data.metrics["jobs_failed"] == 1
    children = {r.data.params["reflect.edit_budget"]: r.info.status for r in runs_of(uri)
                if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert children == {"1": "FINISHED", "2": "FAILED"}


@pytest.mark.slow
def test_a_sweep_dir_refuses_a_sweep_with_other_fixed_settings(tmp_path, launch_dir, server):
    first = write_dataset(tmp_path / "a", n_fail=2, n_succ=1)
    other = write_dataset(tmp_path / "b", n_fail=3, n_succ=1, seed=5)
    uri = f"sqlite:///{launch_dir / 'outputs' / 'mlflow.db'}"
    args = ["-m", "optimizer=compatible", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
            "name=shared", "reflect.edit_budget=1,2"]
    ok = run_cli(*args, f"data.dir={first}", cwd=launch_dir)
    assert ok.returncode == 0, ok.stderr[-3000:]
    [parent] = sweep_parents(uri)
    assert parent.info.status == "FINISHED"
    assert parent.data.params["reflect.edit_budget"] == "1,2" and parent.data.params["data.dir"] == str(first)
    assert parent.data.metrics["jobs"] == 2 and parent.data.metrics["jobs_finished"] == 2
    before = len(runs_of(uri))
    refused = run_cli(*args, f"data.dir={other}", cwd=launch_dir)
    assert refused.returncode == 2
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "data.dir" in lines[0] and "name=" in lines[0], refused.stderr
    assert len(runs_of(uri)) == before
    more_seeds = run_cli(*args, f"data.dir={first}", "reflect.seed=7", cwd=launch_dir)  # a new axis value: fine
    assert more_seeds.returncode == 0, more_seeds.stderr[-3000:]


# ---------------------------------------------------------------------------------------------
# 5. what a run shows: name, params, dataset, prompts, traces; a dry run; relog writes the same


@pytest.fixture(scope="module")
def shown(tmp_path_factory, migrated_store):
    """One launch dir, one store: a run whose minibatches are split to fit the window, the same run
    again with another template, a run without traces, a dry run, and the first run relogged into
    a second store."""
    import shutil

    root = tmp_path_factory.mktemp("shown")
    launch = root / "launch"
    (launch / "outputs").mkdir(parents=True)
    shutil.copy(migrated_store, launch / "outputs" / "mlflow.db")
    other = root / "other.db"
    shutil.copy(migrated_store, other)
    data = write_dataset(root / "data", n_fail=4, n_succ=2)
    (root / "my_error.md").write_text("Find what went wrong.\nReply with one JSON object.\n")
    uri = f"sqlite:///{launch / 'outputs' / 'mlflow.db'}"
    with OptimizerServer() as server:
        base = [f"data.dir={data}", "optimizer=compatible", f"optimizer.base_url={server.base_url}",
                "optimizer.model=test", "optimizer.cache=off", "reflect.minibatch_size=4"]
        runs = {
            "split": [*base, "optimizer.context_window=2800", "optimizer.max_output_tokens=1000"],
            "custom": [*base, f"prompts.error={root / 'my_error.md'}"],
            "untraced": [*base, "mlflow.trace_calls=false"],
            "dry": [f"data.dir={data}", "optimizer=dry_run", "reflect.minibatch_size=4"],
        }
        done = {name: run_cli(*args, f"hydra.run.dir={root / name}", cwd=launch) for name, args in runs.items()}
        again = run_cli(*runs["split"], f"hydra.run.dir={root / 'split_again'}", cwd=launch)
    relog = subprocess.run([sys.executable, "-m", "reflact.relog", str(root / "split"), "--tracking-uri",
                            f"sqlite:///{other}"], cwd=launch, capture_output=True, text=True)
    return {"root": root, "uri": uri, "other": f"sqlite:///{other}", "done": done, "again": again, "relog": relog,
            "server": server}


def one_run(uri: str, run_dir: Path):
    [run] = runs_of(uri, run_dir)
    return run


def test_runs_are_named_by_what_differs_and_tagged_with_their_overrides(shown):
    for proc in shown["done"].values():
        assert proc.returncode == 0, proc.stderr[-2000:]
    run = one_run(shown["uri"], shown["root"] / "split")
    assert run.info.run_name == "patch M4 L4 s42"
    assert "optimizer.context_window=2800" in run.data.tags["reflact.overrides"]
    assert one_run(shown["uri"], shown["root"] / "dry").info.run_name == "patch M4 L4 s42 dry run"
    assert run.data.tags["mlflow.user"] and run.data.tags["mlflow.source.name"] == "reflact"


def test_params_hold_what_was_set_and_leave_empty_settings_out(shown):
    params = one_run(shown["uri"], shown["root"] / "split").data.params
    assert params["optimizer.context_window"] == "2800" and params["reflect.minibatch_size"] == "4"
    assert "" not in params.values()
    assert not any(key.startswith("optimizer.azure") for key in params)  # not in use
    assert "optimizer.temperature" not in params and params["template_hash.failure"]


def test_relog_logs_the_same_params_and_metrics_as_the_live_run(shown):
    assert shown["relog"].returncode == 0, shown["relog"].stderr[-2000:]
    live = one_run(shown["uri"], shown["root"] / "split")
    relogged = one_run(shown["other"], shown["root"] / "split")
    assert relogged.data.params == live.data.params
    wall = {"wall_time_s"}
    assert {k: v for k, v in relogged.data.metrics.items() if k not in wall} == {
        k: v for k, v in live.data.metrics.items() if k not in wall}
    assert relogged.info.status == "FINISHED"


def test_the_dataset_is_an_input_with_its_digest_and_counts(shown):
    run = one_run(shown["uri"], shown["root"] / "split")
    [dataset] = run.inputs.dataset_inputs
    assert dataset.dataset.name == "data" and len(dataset.dataset.digest) == 16
    assert json.loads(dataset.dataset.profile) == {"results": 6, "failures": 4, "successes": 2, "skipped": 0}
    again = one_run(shown["uri"], shown["root"] / "split_again")
    assert again.inputs.dataset_inputs[0].dataset.digest == dataset.dataset.digest


def test_jobs_logging_the_same_dataset_at_once_all_get_it(tmp_path):
    """Parallel jobs of a sweep (joblib) log one dataset at the same moment: the store's unique key
    refuses all but one insert, and the others must find that row instead of failing."""
    from reflact.tracking.store import Store

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    stores = [Store(uri, EXPERIMENT, tmp_path) for _ in range(8)]
    for number, store in enumerate(stores):
        store.create(f"job {number}", {}, 0)
    barrier, failures = threading.Barrier(len(stores)), []

    def log(store: Store) -> None:
        barrier.wait()
        try:
            store.log_dataset("data", "0123456789abcdef", "file:///data", {"results": 1})
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            failures.append(exc)

    threads = [threading.Thread(target=log, args=(store,)) for store in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    for store in stores:
        [dataset] = store.client.get_run(store.run_id).inputs.dataset_inputs
        assert dataset.dataset.digest == "0123456789abcdef"


def test_templates_are_registered_once_and_linked_to_each_run(shown):
    client = client_for(shown["uri"])
    linked = json.loads(one_run(shown["uri"], shown["root"] / "split").data.tags["mlflow.linkedPrompts"])
    assert {(p["name"], p["version"]) for p in linked} == {("reflact.failure.patch", "1"),
                                                           ("reflact.success.patch", "1")}
    again = json.loads(one_run(shown["uri"], shown["root"] / "split_again").data.tags["mlflow.linkedPrompts"])
    assert again == linked  # the same text: no new version
    custom = json.loads(one_run(shown["uri"], shown["root"] / "custom").data.tags["mlflow.linkedPrompts"])
    assert ("reflact.failure.patch.custom", "1") in {(p["name"], p["version"]) for p in custom}
    assert client.load_prompt("prompts:/reflact.failure.patch.custom/1").template.startswith("Find what went wrong.")


def test_each_request_is_a_trace_with_the_messages_of_its_own_part(shown):
    run = one_run(shown["uri"], shown["root"] / "split")
    traces = client_for(shown["uri"]).search_traces(locations=[run.info.experiment_id], run_id=run.info.run_id,
                                                    max_results=100)
    users = sorted(t.data.spans[0].inputs["messages"][1]["content"] for t in traces)
    summary = json.loads((shown["root"] / "split" / "summary.json").read_text())
    assert len(traces) == summary["counts"]["calls"] > summary["counts"]["minibatches"]  # split into parts
    parts = [(shown["root"] / "split" / "calls" / mb["tag"] / name).read_text()
             for mb in summary["minibatches"] for name in ("user.md", "user_2.md")
             if (shown["root"] / "split" / "calls" / mb["tag"] / name).is_file()]
    assert users == sorted(parts)  # every part's exact prompt, none repeated


def test_the_kept_items_are_a_table_mlflow_reads_back(shown):
    """The run's kept items, one row each, as a table MLflow's own reader loads and its UI lists."""
    from reflact.running.rundir import RunDir
    from reflact.tracking.store import mlflow_globals_at

    run = one_run(shown["uri"], shown["root"] / "split")
    with mlflow_globals_at(shown["uri"]):  # load_table searches the runs of MLflow's global store
        table = client_for(shown["uri"]).load_table(run.info.experiment_id, "kept_items.json", [run.info.run_id])
    kept = list(RunDir(shown["root"] / "split").kept_items())
    assert len(kept) > 1
    assert table.to_dict("records") == [
        {"minibatch": row["minibatch"], "position": row["position"], "trajectory_ids": ", ".join(row["trajectory_ids"]),
         "item": json.dumps(row["item"], ensure_ascii=False), "apply_status": row["apply"]["status"]}
        for row in kept
    ]
    assert json.loads(run.data.tags["mlflow.loggedArtifacts"]) == [{"path": "kept_items.json", "type": "table"}]


def test_traces_are_off_with_trace_calls_false(shown):
    run = one_run(shown["uri"], shown["root"] / "untraced")
    assert not client_for(shown["uri"]).search_traces(locations=[run.info.experiment_id], run_id=run.info.run_id)


def test_a_dry_run_is_tagged_and_logs_estimates_under_their_own_names(shown):
    run = one_run(shown["uri"], shown["root"] / "dry")
    assert run.data.tags["reflact.dry_run"] == "true" and run.info.status == "FINISHED"
    metrics = run.data.metrics
    assert metrics["estimated_cost_usd"] > 0 and metrics["estimated_tokens_prompt"] > 0
    assert not {"cost_usd", "spent_usd", "tokens_prompt"} & set(metrics)


def test_a_setting_set_on_one_side_only_is_another_fixed_setting(tmp_path):
    from reflact.core.errors import UserError
    from reflact.running.rundir import SweepDir
    from reflact.sweeps.sweep import check_identity

    sweep = SweepDir(tmp_path)
    check_identity(sweep, {"data.dir": "a", "reflect.seed": "1"}, {"reflect.edit_budget": ["1", "2"]})
    check_identity(sweep, {"data.dir": "a", "reflect.seed": "2", "reflect.edit_budget": "4"}, {})  # axes may vary
    with pytest.raises(UserError, match="optimizer.temperature: 'unset' there, '0.7' now"):
        check_identity(sweep, {"data.dir": "a", "optimizer.temperature": "0.7"}, {})
    with pytest.raises(UserError, match="data.dir: 'a' there, 'b' now"):
        check_identity(sweep, {"data.dir": "b"}, {})
