"""Tracking has deadlines: a tracking server that is down, frozen, dropping connections or a black
hole costs the run at most `mlflow.deadline_s` of silence at its end, then one warning naming
relog; the run's exit code and run dir are those of a run without tracking. relog then rebuilds
the run completely (traces included). A fresh sqlite store opened by several runs at once keeps
every run.

The runs are `python -m reflact.run` subprocesses against the loopback optimizer server and the
failing tracking server of reflact/testing/tracking_endpoint.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from reflact.testing.optimizer_server import OptimizerServer, Response, chat_body, default_reply
from reflact.testing.tracking_endpoint import MODES, FailingTracking
from tests.conftest import ok, output, run_cli, summary_of, write_dataset

# far beyond the deadline, far below what a run held by its tracker took (355 s frozen, ~95 s black hole)
HELD_S = 60


def run_against(mode: str, tmp_path: Path, server: OptimizerServer) -> subprocess.CompletedProcess:
    data = write_dataset(tmp_path / "data", n_fail=4, n_succ=0)
    (tmp_path / "launch").mkdir()
    with FailingTracking(mode) as tracking:
        return run_cli(
            f"data.dir={data}",
            f"optimizer.base_url={server.base_url}",
            "optimizer.model=test",
            "reflect.minibatch_size=1",
            f"hydra.run.dir={tmp_path / 'run'}",
            f"mlflow.tracking_uri={tracking.uri}",
            "mlflow.deadline_s=1",
            cwd=tmp_path / "launch",
            timeout=HELD_S,
        )


@pytest.mark.parametrize("mode", MODES)
def test_a_failing_tracking_server_costs_one_warning_and_nothing_of_the_run(mode, tmp_path, server):
    proc = run_against(mode, tmp_path, server)
    ok(proc)
    assert summary_of(tmp_path / "run")["counts"]["minibatches_done"] == 4
    assert len(list((tmp_path / "run" / "patches").glob("*.json"))) == 4
    warnings = [line for line in output(proc).splitlines() if "WARNING" in line and "MLflow" in line]
    assert len(warnings) == 1, output(proc)
    assert f"python -m reflact.relog {tmp_path / 'run'}" in warnings[0]
    assert "Traceback" not in output(proc)
    assert json.loads((tmp_path / "run" / "mlflow_run.json").read_text())["status"] == "INCOMPLETE"


@pytest.mark.slow
def test_relog_rebuilds_a_run_whose_server_was_down_with_every_trace(tmp_path, server, migrated_store):
    ok(run_against("refuse", tmp_path, server))
    store = tmp_path / "good.db"
    store.write_bytes(migrated_store.read_bytes())
    uri = f"sqlite:///{store}"
    relog = subprocess.run(
        [sys.executable, "-m", "reflact.relog", str(tmp_path / "run"), "--tracking-uri", uri],
        cwd=tmp_path / "launch",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert relog.returncode == 0, relog.stderr[-3000:]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("reflact")
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.metrics["minibatches_done"] == 4
    traces = client.search_traces(locations=[experiment.experiment_id], run_id=run.info.run_id, max_results=100)
    calls = summary_of(tmp_path / "run")["counts"]["calls"]
    assert len(traces) == calls == 4
    assert {t.info.tags["reflact.minibatch"] for t in traces} == {
        p.stem for p in (tmp_path / "run" / "patches").glob("*.json")
    }
    assert all(t.data.spans and t.data.spans[0].inputs["messages"] for t in traces)


OPEN_A_RUN = """
import sys
from pathlib import Path
from reflact.tracking.store import Store
store = Store(sys.argv[1], "reflact", Path(sys.argv[2]))
store.create(sys.argv[3], {}, 0)
store.end("FINISHED", 1)
"""


def test_runs_opening_a_fresh_sqlite_store_at_once_all_keep_their_run(tmp_path):
    uri = f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}"
    names = [f"run {i}" for i in range(3)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", OPEN_A_RUN, uri, str(tmp_path), name], stderr=subprocess.PIPE, text=True
        )
        for name in names
    ]
    errors = [proc.communicate(timeout=180)[1] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0, 0], errors
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("reflact").experiment_id])
    assert sorted(r.info.run_name for r in runs) == names


def test_a_local_sqlite_store_is_waited_for_longer_than_a_server():
    # parallel sweep jobs on a loaded machine kept a fresh sqlite store busy (not down) for over 10 s:
    # its runs were given up as if a server had died
    from reflact.tracking.live import LOCAL_STORE_S, busy_allowance

    assert busy_allowance("http://127.0.0.1:5000", 10.0) == 10.0
    assert busy_allowance("postgresql+psycopg2://u@h/db", 3.0) == 3.0
    assert busy_allowance("sqlite:////launch/outputs/mlflow.db", 10.0) == LOCAL_STORE_S >= 60
    assert busy_allowance("sqlite:////launch/outputs/mlflow.db", 300.0) == 300.0


def test_the_tracker_process_starts_with_the_run_and_its_command_line_names_no_store(tmp_path, server, monkeypatch):
    """The tracker starts with the run, before its first request (mlflow's import overlaps the
    run's own start); the store's scheme, then its URI, reach it through its pipe: its command
    line (which `ps` shows every user) names nothing of the store."""
    import reflact
    from reflact.tracking import live

    started: list[list[str]] = []
    real_popen = subprocess.Popen

    def recording(args, **kwargs):
        started.append(list(args))
        return real_popen(args, **kwargs)

    monkeypatch.setattr(live.subprocess, "Popen", recording)
    trackers_at_request: list[int] = []

    def script(request: dict, number: int) -> Response:
        trackers_at_request.append(len(started))
        return Response(body=chat_body(json.dumps(default_reply(request))))

    server.script = script
    data = write_dataset(tmp_path / "data", n_fail=2, n_succ=0)
    with FailingTracking("refuse") as tracking:
        uri = tracking.uri
        done = reflact.reflect(data, overrides=["optimizer=compatible", f"optimizer.base_url={server.base_url}",
                                                "optimizer.model=test", f"mlflow.tracking_uri={uri}",
                                                "mlflow.deadline_s=1"], run_dir=tmp_path / "run", launch_dir=tmp_path)
    assert done.status == "FINISHED"
    assert [args[-1] for args in started] == ["reflact.tracking.worker"]
    assert not [arg for arg in started[0] if "http" in arg or uri.split("//")[1] in arg]
    assert trackers_at_request == [1]


def _spawns_counted(monkeypatch) -> list[int]:
    """The tracker processes started from now on in this process (their pids)."""
    from reflact.tracking import process

    started: list[int] = []
    real_spawn = process.spawn

    def counting():
        proc = real_spawn()
        started.append(proc.pid)
        return proc

    monkeypatch.setattr(process, "spawn", counting)
    return started


def _reflect_with(spare, data: Path, run_dir: Path, launch_dir: Path, *overrides: str):
    from reflact.api import compose, run
    from reflact.orchestration.experiment import Launch

    cfg = compose([f"data.dir={data}", "optimizer=compatible", "optimizer.model=test", "reflect.minibatch_size=1",
                   *overrides])
    return run(cfg, {}, run_dir, Launch(launch_dir, tracker=spare))


def test_the_runs_of_one_process_take_over_its_idle_tracker_and_each_gets_its_whole_mlflow_run(
    tmp_path, server, migrated_store, monkeypatch
):
    """A run whose tracker ended cleanly hands it, idle, to the process's next run (the next job
    of a sweep in Hydra's basic launcher): one process for both, mlflow imported once; each run
    still gets its own MLflow run, every trace in it, ended FINISHED. The idle one goes when
    discarded."""
    from mlflow.tracking import MlflowClient

    from reflact.tracking.process import SpareTracker

    started = _spawns_counted(monkeypatch)
    data = write_dataset(tmp_path / "data", n_fail=2, n_succ=2)
    (tmp_path / "outputs").mkdir()
    (tmp_path / "outputs" / "mlflow.db").write_bytes(migrated_store.read_bytes())
    spare = SpareTracker()
    url = f"optimizer.base_url={server.base_url}"
    first = _reflect_with(spare, data, tmp_path / "one", tmp_path, url, "reflect.edit_budget=1")
    kept = spare.take()
    assert kept is not None and kept.poll() is None  # idle, waiting for a next run
    spare.give(kept)
    second = _reflect_with(spare, data, tmp_path / "two", tmp_path, url, "reflect.edit_budget=2")
    assert started == [kept.pid]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    for done in (first, second):
        assert done.status == "FINISHED"
        run = client.get_run(done.mlflow_run_id)
        assert run.info.status == "FINISHED"
        assert run.data.metrics["minibatches_done"] == 4
        traces = client.search_traces(locations=[run.info.experiment_id], run_id=run.info.run_id, max_results=100)
        assert len(traces) == done.summary["counts"]["calls"] == 4
    assert first.mlflow_run_id != second.mlflow_run_id
    spare.discard()
    assert kept.wait(timeout=10) is not None  # stopped (not waited for by reflact: the kernel tears it down)


def test_a_tracker_that_gave_up_is_not_handed_to_the_next_run(tmp_path, server, monkeypatch):
    """A tracker whose store never answered is stopped with its run; the next run starts its own."""
    from reflact.tracking.process import SpareTracker

    started = _spawns_counted(monkeypatch)
    data = write_dataset(tmp_path / "data", n_fail=2, n_succ=0)
    spare = SpareTracker()
    with FailingTracking("refuse") as tracking:
        failing = [f"mlflow.tracking_uri={tracking.uri}", "mlflow.deadline_s=1"]
        done = _reflect_with(spare, data, tmp_path / "run", tmp_path, f"optimizer.base_url={server.base_url}", *failing)
    assert done.status == "FINISHED" and done.mlflow_run_id is None
    assert spare.take() is None
    assert len(started) == 1


def _trackers_marked(mark: str) -> list[int]:
    """The live tracker processes whose environment holds `mark` (processes of this test alone)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:  # ended meanwhile, or not ours to read
            continue
        if b"reflact.tracking.worker" in cmdline and mark.encode() in environ and state != "Z":
            found.append(int(proc.name))
    return found


def _no_tracker_left(mark: str, timeout_s: float = 10.0) -> bool:
    """No tracker of this test alive within `timeout_s`: one stopped at the end is not waited
    for, so it is gone once the kernel tore it down."""
    deadline = time.monotonic() + timeout_s
    while _trackers_marked(mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _trackers_marked(mark) == []


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc")
@pytest.mark.parametrize(
    "how",
    [
        pytest.param(["reflect.minibatch_size=0"], id="a mistake"),
        pytest.param(["mlflow.enabled=false"], id="mlflow off"),
        pytest.param(["--cfg", "job"], id="--cfg"),
        pytest.param(["hydra/job_logging=nonexistent"], id="a config Hydra refuses"),
        pytest.param([], id="a finished run"),
        pytest.param(["-m", "reflect.edit_budget=1,2"], id="a sweep"),
    ],
)
def test_the_command_line_leaves_no_tracker_process_behind(tmp_path, server, how):
    """The command line starts a tracker process before Hydra composes; a run that needs none
    (MLflow off, a config printed, a mistake found) ends it too, and so do a run and a sweep
    whose last job leave one idle."""
    mark = f"reflact-test-{uuid.uuid4().hex}"
    data = write_dataset(tmp_path / "data", n_fail=2, n_succ=0)
    args = [f"data.dir={data}", "optimizer=compatible", f"optimizer.base_url={server.base_url}",
            "optimizer.model=test", f"hydra.run.dir={tmp_path / 'run'}", *how]
    done = run_cli(*args, cwd=tmp_path, env={"REFLACT_TEST_MARK": mark})
    assert done.returncode in (0, 2), done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert _no_tracker_left(mark)


# the command line with the tracker's start replaced by a note of what was imported by then
_SPAWN_PROBE = """
import sys
from reflact.tracking import process

def spawn():
    print("spawned after", sorted(m for m in ("hydra", "omegaconf", "pydantic", "reflact.config") if m in sys.modules))
    raise OSError("not started in this test")

process.spawn = spawn
from reflact.run import main
main()
"""


@pytest.mark.parametrize("how", [["--cfg", "job"], ["+exp=demo", "--help"]], ids=["a run", "--help"])
def test_the_command_line_starts_its_tracker_before_it_imports_hydra(tmp_path, how):
    """The tracker imports mlflow (seconds of CPU) beside the run's whole start: the command line
    starts it before it imports Hydra or reflact's config (~0.3 s); a request for help starts none."""
    done = subprocess.run([sys.executable, "-c", _SPAWN_PROBE, *how], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    spawned = [line for line in done.stdout.splitlines() if line.startswith("spawned after")]
    assert spawned == ([] if "--help" in how else ["spawned after []"])
    assert "reflect:" in done.stdout  # the command line went on: the config (or the help) was printed


# a process a launcher sends jobs to: each job's spare arrives pickled; the first job there gives
# its tracker back, the second takes it
_WORKER_PROBE = """
import pickle, subprocess, sys
with open(sys.argv[1], "rb") as f:
    sent = f.read()
first, second = pickle.loads(sent), pickle.loads(sent)
idle = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
first.give(idle)
print(first is second, second.take() is idle, second.take() is None)
idle.kill()
"""


def test_a_spare_pickled_to_another_process_is_that_process_s_own(tmp_path):
    """A launcher that pickles jobs to its workers (joblib, Ray) sends no tracker with them: every
    job there gets the worker's own spare, so a tracker one job gave back is the next job's; the
    launching process keeps its own."""
    import pickle

    from reflact.tracking.process import SpareTracker

    home = SpareTracker()
    idle = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    home.give(idle)
    (tmp_path / "spare.pickle").write_bytes(pickle.dumps(home))
    done = subprocess.run([sys.executable, "-c", _WORKER_PROBE, str(tmp_path / "spare.pickle")],
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["True", "True", "True"], done.stderr[-3000:]
    assert home.take() is idle and idle.poll() is None  # the worker never saw this process's tracker
    idle.kill()
    idle.wait()


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc")
def test_a_joblib_worker_hands_its_idle_tracker_to_its_next_job(tmp_path, server, migrated_store):
    """Four jobs on joblib's two workers start two tracker processes, not four: each worker's
    next job takes the tracker its last one gave back (mlflow imported and the store opened once
    per worker). Every job's MLflow run still ends FINISHED with one trace per request, and no
    tracker is left once the sweep returned."""
    from mlflow.tracking import MlflowClient

    mark = f"reflact-test-{uuid.uuid4().hex}"
    data = write_dataset(tmp_path / "data", n_fail=2, n_succ=2)
    (tmp_path / "outputs").mkdir()
    (tmp_path / "outputs" / "mlflow.db").write_bytes(migrated_store.read_bytes())
    args = ["-m", f"data.dir={data}", "optimizer=compatible", f"optimizer.base_url={server.base_url}",
            "optimizer.model=test", "reflect.edit_budget=1,2,3,4", "hydra/launcher=joblib",
            "hydra.launcher.n_jobs=2"]
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "REFLACT_TEST_MARK": mark}
    sweep = subprocess.Popen([sys.executable, "-m", "reflact.run", *args], cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: set[int] = set()
    while sweep.poll() is None:  # a tracker lives for seconds at least (it imports mlflow)
        seen.update(_trackers_marked(mark))
        time.sleep(0.05)
    _, stderr = sweep.communicate()
    assert sweep.returncode == 0, stderr[-3000:]
    # two when every hand-over succeeds; CI once saw three (a loaded machine; not explained: a tracker
    # that missed its end's bound is stopped, and loky may replace a worker): fewer than one per job
    assert 1 <= len(seen) < 4, seen
    assert _no_tracker_left(mark)
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("reflact")
    children = [r for r in client.search_runs([experiment.experiment_id]) if "mlflow.parentRunId" in r.data.tags]
    assert len(children) == 4
    for run in children:
        assert run.info.status == "FINISHED"
        traces = client.search_traces(locations=[experiment.experiment_id], run_id=run.info.run_id, max_results=100)
        assert len(traces) == run.data.metrics["calls"] == 2


def test_the_tracker_opens_a_local_store_before_the_run_starts_writing(tmp_path):
    """Told the store alone (no run yet: the run still prepares its first requests), the tracker
    opens a local sqlite file, migrating a fresh one, so that the run's first write finds it ready."""
    import sqlite3
    import time

    from reflact.tracking import process
    from reflact.tracking.process import Opening

    db = tmp_path / "outputs" / "mlflow.db"
    proc = process.spawn()
    try:
        process.write(proc, Opening(f"sqlite:///{db}"))
        deadline = time.monotonic() + 120
        tables: set[str] = set()
        while "experiments" not in tables and time.monotonic() < deadline:
            time.sleep(0.2)
            if not db.exists():
                continue
            try:
                with contextlib.closing(sqlite3.connect(db)) as connection:
                    tables = {row[0] for row in connection.execute("select name from sqlite_master")}
            except sqlite3.OperationalError:  # locked while it migrates
                continue
        assert "experiments" in tables
        assert proc.poll() is None  # still waiting for its run
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.skipif(not hasattr(os, "getsid"), reason="POSIX sessions")
def test_the_tracker_shares_the_run_s_session_in_a_process_group_of_its_own():
    """A terminal's Ctrl-C reaches the foreground process group only: the tracker's own group keeps
    it out (the run ends its MLflow run through the pipe). It stays in the run's session: Linux
    shares CPU between sessions first, so a tracker in a session of its own takes as much CPU as
    all of a sweep's jobs together on a busy machine."""
    from reflact.tracking import process

    proc = process.spawn()
    try:
        assert os.getpgid(proc.pid) == proc.pid != os.getpgid(0)
        assert os.getsid(proc.pid) == os.getsid(0)
    finally:
        process.end(proc)
        proc.wait()
