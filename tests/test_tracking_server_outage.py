"""A shared tracking server restarted mid-sweep, on real engines on 127.0.0.1: PostgreSQL (initdb in a
temp dir) behind `mlflow server`, a 4-job joblib sweep logging to it, the server killed while jobs
run and started again. The jobs retry while they run and catch up once it answers (their
`mlflow.deadline_s` covers the restart): afterwards every job has exactly one FINISHED run with
all its traces, attached to the parent, and the parent is FINISHED with every job.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from reflact.testing.optimizer_server import OptimizerServer
from tests.conftest import summary_of, write_dataset

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def as_postgres_user(command: list[str]) -> list[str]:
    """initdb and postgres refuse to run as root: run them as an unprivileged user then."""
    if os.geteuid() != 0:
        return command
    user = "postgres" if _user_exists("postgres") else "nobody"
    return ["runuser", "-u", user, "--", *command]


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


@pytest.fixture
def postgres(tmp_path):
    if shutil.which("initdb") is None or shutil.which("pg_ctl") is None:
        pytest.skip("PostgreSQL's initdb/pg_ctl are not installed")
    pytest.importorskip("psycopg2", reason="the server's backend needs psycopg2 (psycopg2-binary)")
    # its own temp dir: pytest's are private to this user, and the server may run as another one
    root = Path(tempfile.mkdtemp(prefix="reflact-pg-"))
    os.chmod(root, 0o755)
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres" if _user_exists("postgres") else "nobody")
        os.chown(root, user.pw_uid, user.pw_gid)
    port = free_port()
    try:
        subprocess.run(as_postgres_user(["initdb", "-D", str(root / "data"), "-U", "reflact", "--auth=trust"]),
                       check=True, capture_output=True, cwd=root)
        options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1"
        subprocess.run(as_postgres_user(["pg_ctl", "-D", str(root / "data"), "-o", options, "-l",
                                         str(root / "log"), "-w", "start"]), check=True, capture_output=True, cwd=root)
        yield f"postgresql+psycopg2://reflact@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(as_postgres_user(["pg_ctl", "-D", str(root / "data"), "-m", "immediate", "stop"]),
                       capture_output=True, cwd=root)
        shutil.rmtree(root, ignore_errors=True)


def mlflow_server(backend: str, artifacts: Path, port: int, log: Path) -> subprocess.Popen:
    """`mlflow server` on `port`, once /health answers."""
    mlflow_bin = Path(sys.executable).parent / "mlflow"
    proc = subprocess.Popen(
        [str(mlflow_bin), "server", "--backend-store-uri", backend, "--artifacts-destination", str(artifacts),
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True,  # noqa: SIM115
        env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return proc
        except OSError:
            time.sleep(0.5)
    kill(proc)
    pytest.fail(f"mlflow server did not come up:\n{log.read_text(errors='replace')[-3000:]}")


def kill(proc: subprocess.Popen) -> None:
    """The server and the uvicorn workers it started, at once (a crash, not a shutdown)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def child_runs(uri: str) -> tuple[list, list]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("reflact")
    if experiment is None:
        return [], []
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if r.data.tags.get("reflact.sweep_parent") == "true"]
    return parents, [r for r in runs if r not in parents]


def test_a_sweep_survives_its_tracking_server_restarted_mid_sweep(tmp_path, postgres):
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server_log = tmp_path / "mlflow.log"
    tracking = mlflow_server(postgres, tmp_path / "artifacts", port, server_log)
    data = write_dataset(tmp_path / "data", n_fail=6, n_succ=0)
    launch = tmp_path / "launch"
    launch.mkdir()
    slow = lambda request, number: time.sleep(1.5)  # noqa: E731 - each reply takes a while: jobs are mid-run
    try:
        with OptimizerServer(script=slow) as optimizer:
            sweep = subprocess.Popen(
                [sys.executable, "-m", "reflact.run", "-m", f"data.dir={data}",
                 f"optimizer.base_url={optimizer.base_url}",
                 "optimizer.model=test", "reflect.minibatch_size=2", "reflect.workers=1", "reflect.edit_budget=1,2,3,4",
                 "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", f"mlflow.tracking_uri={uri}",
                 "mlflow.deadline_s=180", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                cwd=launch, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"},
            )
            _wait(lambda: any(r.info.status == "RUNNING" for r in child_runs(uri)[1]), "a job's run RUNNING")
            kill(tracking)
            time.sleep(3)  # requests fail meanwhile: the jobs go on
            tracking = mlflow_server(postgres, tmp_path / "artifacts", port, server_log)
            out, err = sweep.communicate(timeout=900)
        assert sweep.returncode == 0, err[-4000:]
        [parent], children = child_runs(uri)
        assert parent.info.status == "FINISHED"
        assert len(children) == 4
        assert all(c.info.status == "FINISHED" for c in children)
        assert all(c.data.tags.get("mlflow.parentRunId") == parent.info.run_id for c in children)
        assert sorted(c.data.params["reflect.edit_budget"] for c in children) == ["1", "2", "3", "4"]
        _assert_every_trace(uri, children, tmp_path / "sweep")
    finally:
        kill(tracking)


def _assert_every_trace(uri: str, children: list, sweep_dir: Path) -> None:
    import mlflow

    # a trace's spans (mlflow-artifacts:/...) are fetched through the process-wide tracking URI,
    # not the client's: without this the test depends on what ran before it in the worker
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        _assert_traces_of(mlflow.MlflowClient(tracking_uri=uri), children, sweep_dir)
    finally:
        mlflow.set_tracking_uri(previous)


def _assert_traces_of(client, children: list, sweep_dir: Path) -> None:
    for child in children:
        run_dir = Path(child.data.tags["reflact.run_dir"])
        assert sweep_dir in run_dir.parents
        traces = client.search_traces(locations=[child.info.experiment_id], run_id=child.info.run_id,
                                      max_results=200)
        keys = [(t.info.tags["reflact.minibatch"], t.info.tags["reflact.request"]) for t in traces]
        assert len(keys) == len(set(keys)) == summary_of(run_dir)["counts"]["calls"]


def _wait(condition, what: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except Exception:  # the server is still starting
            pass
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}")



