"""The end of a run's MLflow view is bounded and whole, whatever the store does:

- the end waits for the tracker until fixed moments (mlflow.deadline_s from the last reply for a
  failing store); a store that keeps answering slowly, or a frozen server whose trace exports
  MLflow swallows, never moves them, and what is not written by then is relog's (INCOMPLETE);
- a fresh local sqlite store is migrated aside and renamed in, so a process killed while it
  migrates leaves a usable store; the run's end never stops a tracker that migrates; a store an
  older tool left half-migrated is named in one line;
- a write retried after a partial success adds no metric point twice; the run's status is written
  even when its files cannot be, with a tag saying what is missing; the end time is the run's end.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from reflact.testing.optimizer_server import Response, chat_body, default_reply
from reflact.testing.tracking_endpoint import SlowProxy
from reflact.tracking.live import START_S, TrackerProcess
from reflact.tracking.process import Start
from tests.conftest import ok, output, run_cli, start_mlflow_server, stop, summary_of, write_dataset


@pytest.fixture
def tracker():
    """A TrackerProcess whose process is `cat` (it only swallows what it is sent): its answers are
    fed to it by the test, as its listener thread would."""
    cat = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    start = Start(SimpleNamespace(), "http://127.0.0.1:9")  # type: ignore[arg-type]  # never sent
    process = TrackerProcess(start, idle=cat)
    yield process
    cat.kill()
    cat.wait()


def test_answers_never_move_the_end_of_the_wait(tracker):
    """A store that answers every request, slowly, with a backlog that never ends: the end stops
    waiting at its bound (it used to wait as long as answers kept coming, 155-197 s)."""
    tracker._take({"ready": True})
    answering = threading.Event()
    until = time.monotonic() + 30  # an unbounded wait ends when the answers do

    def answer() -> None:
        while not answering.wait(0.02) and time.monotonic() < until:
            tracker._take({"answered": True})

    threading.Thread(target=answer, daemon=True).start()
    started = time.monotonic()
    try:
        failure = tracker.end(started, deadline_s=0.3, busy_s=0.3)
    finally:
        answering.set()
    assert time.monotonic() - started < 10  # the bound; an unbounded wait only ends with the answers
    assert failure == "not written within mlflow.deadline_s=0.3 of the end"


def test_the_bounds_are_fixed_moments(tracker):
    ended = time.monotonic()
    assert tracker._bound(ended, 2.0, 100.0) == ended + START_S  # importing mlflow: no store asked yet
    tracker._take({"migrating": True})
    assert tracker._bound(ended, 2.0, 100.0) == ended + 100.0  # migrating a fresh local store: never cut short
    tracker._take({"migrating": False})
    tracker._take({"ready": True})
    ready = tracker._ready_at
    assert ready is not None and ready >= ended
    assert tracker._bound(ended, 2.0, 100.0) == ready + 100.0  # a store busy without failing (local sqlite)
    tracker._take({"failing": True})
    assert tracker._bound(ended, 2.0, 100.0) == ready + 2.0
    tracker._take({"ready": True})  # ready again (the next run's start) does not clear a failure
    assert tracker._bound(ended, 2.0, 100.0) == ready + 2.0
    time.sleep(0.01)
    tracker._take({"answered": True})  # an answer changes which bound, never when it counts from
    assert tracker._bound(ended, 2.0, 100.0) == ready + 100.0


def test_a_call_whose_export_mlflow_swallows_is_no_answer():
    from reflact.tracking.worker import Answering

    sent = []
    client = SimpleNamespace(start_trace=lambda **kw: "span", end_trace=lambda *a, **kw: None,
                             log_batch=lambda *a: None)
    answering = Answering(client, sent.append)
    answering.start_trace(name="x")
    answering.end_trace("trace")
    assert sent == []
    answering.log_batch("run")
    assert sent == [{"answered": True}]


def test_a_server_that_did_not_tell_its_version_is_retried_not_traced_one_by_one():
    """MLflow remembers a failed look-up of the server's version for the whole process and then
    sends every trace through its tracer, one request each, whose failures it only logs."""
    from reflact.tracking.store import log_traces

    written = []
    client = SimpleNamespace(start_trace=lambda **kw: written.append(kw))

    def refusing(reason: str):
        def log_spans(location, spans):
            raise NotImplementedError(f"log_spans is not supported: {reason}")

        return SimpleNamespace(log_spans=log_spans)

    event = SimpleNamespace(tag="minibatch_fail_000", number=1, messages=[], reply=None, error="x", ended_at=1.0)
    with pytest.raises(ConnectionError):
        log_traces(client, refusing("could not identify MLflow server version"), "0", "run", [event], "m")
    assert written == []
    # a server older than 3.4 has no log_spans for good: its traces go through the tracer
    with pytest.raises(AttributeError):  # the stand-in client has no end_trace: the tracer path was taken
        log_traces(client, refusing("MLflow server version 3.3.0 is less than 3.4"), "0", "run", [event], "m")
    assert len(written) == 1


# -------------------------------------------------------------------------------- a fresh sqlite store

INTERRUPTED = """
import sys
from pathlib import Path
from mlflow.store.db import utils
from reflact.tracking.sqlite import first_use

real = utils._initialize_tables


def cut_short(engine):  # the schema half made, as a kill in the middle of MLflow's migrations leaves it
    utils.InitialBase.metadata.create_all(engine)
    with engine.begin() as db:
        db.exec_driver_sql("CREATE TABLE _alembic_tmp_params (key VARCHAR(250))")
    raise SystemExit(3)


utils._initialize_tables = cut_short
with first_use(sys.argv[1]):
    pass
"""


def test_a_migration_cut_short_leaves_a_store_the_next_run_opens(tmp_path):
    path = tmp_path / "outputs" / "mlflow.db"
    uri = f"sqlite:///{path}"
    cut = subprocess.run([sys.executable, "-c", INTERRUPTED, uri], capture_output=True, text=True, timeout=120)
    assert cut.returncode == 3, cut.stderr[-2000:]
    assert not path.exists()  # the half-made schema stayed in the copy beside it
    assert [p.name for p in path.parent.glob(".mlflow.db.*.migrating")]

    from reflact.tracking.store import Store

    store = Store(uri, "reflact", tmp_path)
    store.create("after", {}, 0)
    store.end("FINISHED", 1)
    assert not list(path.parent.glob(".mlflow.db.*.migrating"))  # the stale copy went
    assert store.client.get_run(store.run_id).info.status == "FINISHED"


MIGRATING = """
import sys, time
from reflact.tracking.sqlite import first_use

with first_use(sys.argv[1], lambda on: print("migrating" if on else "migrated", flush=True)):
    time.sleep(30)
"""


@pytest.mark.slow
@pytest.mark.parametrize("after_s", [0.05, 0.3, 0.6, 1.0])
def test_a_process_killed_while_it_migrates_leaves_a_usable_store(tmp_path, after_s):
    """SIGKILL at moments of MLflow's own migration (in place, 1 to 3 kills in 3 left a store no
    later run or relog could open)."""
    path = tmp_path / "outputs" / "mlflow.db"
    uri = f"sqlite:///{path}"
    proc = subprocess.Popen([sys.executable, "-c", MIGRATING, uri], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "migrating"
    time.sleep(after_s)
    proc.kill()
    proc.wait()
    from mlflow.tracking import MlflowClient

    from reflact.tracking.store import Store

    store = Store(uri, "reflact", tmp_path)
    store.create("after", {}, 0)
    assert MlflowClient(tracking_uri=uri).get_run(store.run_id).info.run_name == "after"


def half_migrated(path: Path) -> None:
    """A store whose schema MLflow's migrations left behind their recorded version."""
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE alembic_version SET version_num = '867495a8f9d4'")


def test_relog_names_a_half_migrated_store_in_one_line(tmp_path, server):
    run_dir = tmp_path / "run"
    data = write_dataset(tmp_path / "data", n_fail=2, n_succ=0)
    (tmp_path / "launch").mkdir()
    ok(run_cli(f"data.dir={data}", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
               f"hydra.run.dir={run_dir}", "mlflow.enabled=false", cwd=tmp_path / "launch"))
    store = tmp_path / "launch" / "outputs" / "mlflow.db"
    half_migrated(store)
    relog = subprocess.run([sys.executable, "-m", "reflact.relog", str(run_dir)], cwd=tmp_path / "launch",
                           capture_output=True, text=True, timeout=120)
    assert relog.returncode == 2, relog.stderr[-3000:]
    [line] = relog.stderr.strip().splitlines()
    assert f"half-migrated store {store}" in line and "holds no runs: remove it" in line
    assert not (run_dir / "mlflow_run.json").exists()


def test_a_run_on_a_half_migrated_store_says_what_to_do_at_once(tmp_path, server):
    data = write_dataset(tmp_path / "data", n_fail=2, n_succ=0)
    (tmp_path / "launch" / "outputs").mkdir(parents=True)
    half_migrated(tmp_path / "launch" / "outputs" / "mlflow.db")
    proc = run_cli(f"data.dir={data}", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
                   f"hydra.run.dir={tmp_path / 'run'}", "mlflow.deadline_s=600", cwd=tmp_path / "launch", timeout=120)
    ok(proc)  # the run itself is whole; its MLflow view needs the store repaired
    [warning] = [line for line in output(proc).splitlines() if "WARNING" in line and "MLflow" in line]
    assert "half-migrated store" in warning and "python -m reflact.relog" in warning
    assert json.loads((tmp_path / "run" / "mlflow_run.json").read_text())["status"] == "INCOMPLETE"


# -------------------------------------------------------------------------------- partial writes


@pytest.fixture
def mirror(tmp_path, migrated_store):
    """A Mirror on a real sqlite store whose artifact writes can be made to fail."""
    from reflact.running.rundir import RunDir
    from reflact.tracking.mirror import Mirror
    from reflact.tracking.store import Store
    from tests.conftest import make_config, run_context

    store_path = tmp_path / "mlflow.db"
    store_path.write_bytes(migrated_store.read_bytes())
    cfg = make_config(f"data.dir={write_dataset(tmp_path / 'data', 1, 0)}", "mlflow.trace_calls=false")
    run_dir = RunDir(tmp_path / "run")
    run_dir.root.mkdir()
    context = run_context(cfg, params={}, run_dir=run_dir, launch_dir=tmp_path, started_at=time.time())
    mirror = Mirror(Store(f"sqlite:///{store_path}", "reflact", tmp_path), context)
    mirror.open()
    return mirror


def failing_files(store, times: int) -> None:
    """The store's artifact writes fail `times` times (then work again)."""
    real = store.log_files
    left = [times]

    def log_files(files):
        if left[0]:
            left[0] -= 1
            raise OSError("the artifact store refused the file")
        real(files)

    store.log_files = log_files


def test_a_write_retried_after_its_metrics_went_adds_no_point_twice(mirror, tmp_path):
    from reflact.tracking.mirror import Batch

    (tmp_path / "a.txt").write_text("a")
    failing_files(mirror.store, times=1)
    batch = Batch([("minibatch/kept", 2.0, 0), ("minibatch/kept", 3.0, 1)], [(tmp_path / "a.txt", "calls/x")])
    with pytest.raises(OSError):
        mirror.log(batch)
    mirror.log(batch)  # the retry
    history = mirror.store.client.get_metric_history(mirror.store.run_id, "minibatch/kept")
    assert sorted((m.step, m.value) for m in history) == [(0, 2.0), (1, 3.0)]
    assert not batch
    assert [f.path for f in mirror.store.client.list_artifacts(mirror.store.run_id, "calls/x")] == ["calls/x/a.txt"]


def test_an_end_whose_files_cannot_be_written_still_writes_the_status(mirror, tmp_path):
    from reflact.tracking.mirror import MISSING_TAG, Batch

    (tmp_path / "a.txt").write_text("a")
    failing_files(mirror.store, times=1000)
    last = Batch([("kept", 1.0, 0)], [(tmp_path / "a.txt", "run")])
    with pytest.raises(OSError):
        mirror.end(None, "FINISHED", 1234, last=last)
    mirror.abandon("FINISHED", 1234, "OSError: the artifact store refused the file")
    run = mirror.store.client.get_run(mirror.store.run_id)
    assert run.info.status == "FINISHED" and run.info.end_time == 1234
    assert run.data.metrics["kept"] == 1.0
    assert run.data.tags[MISSING_TAG] == ("1 files not written (OSError: the artifact store refused the file); "
                                          f"python -m reflact.relog {tmp_path / 'run'}")
    # the run's description says so too, under its setting and what it did
    from reflact.tracking.description import NOTE_TAG

    assert run.data.tags[NOTE_TAG].endswith(f"**Not wholly in MLflow**: {run.data.tags[MISSING_TAG]}.")


def test_a_run_whose_artifact_store_refuses_files_ends_with_its_status_and_names_relog(tmp_path, server):
    """The artifact folder cannot be made (a file stands where it goes: permissions do not stop
    root): the run's MLflow run still ends FINISHED, tagged with what is missing; relog, once the
    store takes files again, writes them."""
    data = write_dataset(tmp_path / "data", n_fail=2, n_succ=0)
    launch = tmp_path / "launch"
    (launch / "outputs").mkdir(parents=True)
    (launch / "outputs" / "mlartifacts").write_text("not a folder")
    run_dir = tmp_path / "run"
    proc = run_cli(f"data.dir={data}", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
                   f"hydra.run.dir={run_dir}", "mlflow.deadline_s=2", cwd=launch, timeout=120)
    ok(proc)
    [warning] = [line for line in output(proc).splitlines() if "WARNING" in line and "MLflow" in line]
    assert f"python -m reflact.relog {run_dir}" in warning
    record = json.loads((run_dir / "mlflow_run.json").read_text())
    assert record["status"] == "INCOMPLETE"
    from mlflow.tracking import MlflowClient

    from reflact.tracking.mirror import MISSING_TAG

    client = MlflowClient(tracking_uri=f"sqlite:///{launch / 'outputs' / 'mlflow.db'}")
    run = client.get_run(record["run_id"])
    assert run.info.status == "FINISHED"
    assert "files not written" in run.data.tags[MISSING_TAG] and str(run_dir) in run.data.tags[MISSING_TAG]
    assert run.info.end_time / 1000 <= summary_of(run_dir)["times"]["ended_at"] + 5  # the run's end, not the give-up

    (launch / "outputs" / "mlartifacts").unlink()
    relog = subprocess.run([sys.executable, "-m", "reflact.relog", str(run_dir)], cwd=launch,
                           capture_output=True, text=True, timeout=120)
    assert relog.returncode == 0, relog.stderr[-3000:]
    [again] = client.search_runs([run.info.experiment_id])
    assert again.info.status == "FINISHED" and MISSING_TAG not in again.data.tags
    assert again.data.tags["mlflow.note.content"].endswith("Wholly in MLflow.")  # relogged whole
    assert {f.path for f in client.list_artifacts(again.info.run_id, "run")} >= {"run/summary.json"}


# -------------------------------------------------------------------------------- a real server, slow or frozen


@pytest.fixture
def tracking_server(tmp_path, migrated_store):
    proc, url = start_mlflow_server(tmp_path, migrated_store)
    yield url
    stop(proc)


def run_through(proxy: SlowProxy, tmp_path: Path, server, deadline_s: float) -> subprocess.CompletedProcess:
    server.script = lambda request, number: Response(body=chat_body(json.dumps(default_reply(request))), delay_s=0.2)
    data = write_dataset(tmp_path / "data", n_fail=10, n_succ=10)
    (tmp_path / "launch").mkdir(exist_ok=True)
    return run_cli(f"data.dir={data}", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
                   "reflect.minibatch_size=2", "reflect.workers=2", f"hydra.run.dir={tmp_path / 'run'}",
                   f"mlflow.tracking_uri={proxy.uri}", f"mlflow.deadline_s={deadline_s}", cwd=tmp_path / "launch",
                   timeout=170)


def ended_after_last_reply(tmp_path: Path, proc_ended: float) -> float:
    return proc_ended - summary_of(tmp_path / "run")["times"]["ended_at"]


@pytest.mark.slow
@pytest.mark.parametrize("freeze_on", ["/version", "/api/2.0/mlflow/runs/log-batch"])
def test_a_server_frozen_after_the_run_was_created_holds_its_end_no_longer_than_the_deadline(
    tmp_path, server, tracking_server, freeze_on
):
    """/version: the first trace write asks the server's version; frozen there, MLflow used to
    remember the failed look-up and trace each request through its tracer, 5 s each, swallowed."""
    with SlowProxy(tracking_server, freeze_on=(freeze_on,)) as proxy:
        # longer than the 5 s a frozen export takes to time out: each used to count as an answer
        proc = run_through(proxy, tmp_path, server, deadline_s=6)
        ended = time.time()
        assert proxy.frozen.is_set(), (proxy.requests, output(proc)[-3000:])
    ok(proc)
    assert ended_after_last_reply(tmp_path, ended) < 6 + 10  # the deadline and the end's own work; was 155-163 s
    assert json.loads((tmp_path / "run" / "mlflow_run.json").read_text())["status"] == "INCOMPLETE"
    assert f"python -m reflact.relog {tmp_path / 'run'}" in output(proc)


@pytest.mark.slow
def test_a_server_that_answers_slowly_holds_the_end_no_longer_than_the_deadline(tmp_path, server, tracking_server):
    with SlowProxy(tracking_server, delay_s=1.0) as proxy:
        # answers come well within the deadline (a call of MLflow's client makes up to ~5 requests)
        proc = run_through(proxy, tmp_path, server, deadline_s=8)
        ended = time.time()
    ok(proc)
    assert ended_after_last_reply(tmp_path, ended) < 8 + 10  # the deadline and the end's own work; was 180-197 s
    assert json.loads((tmp_path / "run" / "mlflow_run.json").read_text())["status"] == "INCOMPLETE"
    relog = subprocess.run([sys.executable, "-m", "reflact.relog", str(tmp_path / "run"),
                            "--tracking-uri", tracking_server], cwd=tmp_path / "launch",
                           capture_output=True, text=True, timeout=170)
    assert relog.returncode == 0, relog.stderr[-3000:]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_server)
    run = client.get_run(json.loads((tmp_path / "run" / "mlflow_run.json").read_text())["run_id"])
    assert run.info.status == "FINISHED" and run.data.metrics["minibatches_done"] == 10
    traces = client.search_traces(locations=[run.info.experiment_id], run_id=run.info.run_id, max_results=100)
    assert len(traces) == 10


def test_the_run_end_is_the_end_time_however_late_it_is_written(tmp_path):
    """After an outage the end is written at the catch-up moment: its time is the run's end."""
    from reflact.tracking.process import End
    from tests.test_tracker_batches import Feed, a_run_dir

    feed = Feed(a_run_dir(tmp_path))
    feed.send(End(None, "FINISHED", "", 5.0, 1234))
    feed.thread.join(10)
    assert feed.tracker.mirror.ended_ms == 1234  # type: ignore[union-attr]



# -------------------------------------------------------------------------------- a sweep through an outage


@pytest.mark.slow
def test_a_sweep_whose_store_failed_while_its_jobs_ran_says_so_and_one_relog_repairs_it(
    tmp_path, server, tracking_server
):
    """The store answers as the sweep starts (its parent run is made), then freezes for every job,
    and answers again by the sweep's end (a server restart of normal length): the parent's status
    and counts are its job dirs', it and the sweep's last line name the one command that writes
    what MLflow lacks, and that command repairs children and parent together (it used to count the
    runs the store held, RUNNING as FAILED, and relog never touched the parent)."""
    from mlflow.tracking import MlflowClient

    from reflact.sweeps.jobs import NEEDS_RELOG_TAG
    from reflact.tracking.description import NOTE_TAG

    data = write_dataset(tmp_path / "data", n_fail=4, n_succ=0)
    launch = tmp_path / "launch"
    launch.mkdir()
    sweep_dir = launch / "outputs" / "sweeps" / "outage"
    records = lambda: [json.loads(p.read_text()) for p in sweep_dir.rglob("mlflow_run.json")]  # noqa: E731
    with SlowProxy(tracking_server, freeze_on=("/api/2.0/mlflow/runs/create",), freeze_after=1) as proxy:
        proc = subprocess.Popen(
            [sys.executable, "-m", "reflact.run", "-m", "name=outage", f"data.dir={data}", "optimizer.model=test",
             f"optimizer.base_url={server.base_url}", "reflect.minibatch_size=1,2", "reflect.edit_budget=1,2",
             f"mlflow.tracking_uri={proxy.uri}", "mlflow.deadline_s=2"],
            cwd=launch, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"})
        deadline = time.monotonic() + 150
        while len([r for r in records() if r["status"] == "INCOMPLETE"]) < 4:
            assert time.monotonic() < deadline and proc.poll() is None, proxy.requests
            time.sleep(0.2)
        proxy.thaw()  # the store is back for the sweep's end
        out, err = proc.communicate(timeout=150)
        assert proc.returncode == 0, err[-3000:]
        message = (f"4 of 4 jobs not wholly in MLflow (the tracking store failed); "
                   f"python -m reflact.relog {sweep_dir} writes them and this sweep's figures")
        assert err.strip().splitlines()[-1] == f"reflact: sweep {sweep_dir}: {message}", err[-3000:]
        client = MlflowClient(tracking_uri=tracking_server)
        parent_id = json.loads((sweep_dir / "mlflow_parent.json").read_text())["run_id"]
        parent = client.get_run(parent_id)
        assert parent.info.status == "FINISHED"
        assert (parent.data.metrics["jobs"], parent.data.metrics["jobs_finished"]) == (4, 4)
        assert parent.data.tags[NEEDS_RELOG_TAG] == message
        assert parent.data.tags[NOTE_TAG].endswith(f"**Not wholly in MLflow**: {message}.")

        relog = subprocess.run([sys.executable, "-m", "reflact.relog", str(sweep_dir)], cwd=launch,
                               capture_output=True, text=True, timeout=170)
    assert relog.returncode == 0, relog.stderr[-3000:]
    parent = client.get_run(parent_id)
    assert parent.info.status == "FINISHED" and parent.data.metrics["jobs_finished"] == 4
    assert NEEDS_RELOG_TAG not in parent.data.tags and parent.data.tags[NOTE_TAG].endswith("Wholly in MLflow.")
    children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'")
    assert sorted(r.info.status for r in children) == ["FINISHED"] * 4
    job_dirs = {str(p.parent) for p in sweep_dir.rglob("summary.json")}
    assert len(job_dirs) == 4 and {r.data.tags["reflact.run_dir"] for r in children} == job_dirs
    assert all(r["status"] == "FINISHED" for r in records())
