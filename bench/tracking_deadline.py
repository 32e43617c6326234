"""How long a run waits at its end for a tracking server that fails: down (refused), frozen
(accepts, never answers), dropping connections, or a black hole (connecting never completes); and
for a real `mlflow server` made slow (each request a second late: `slow`) or frozen once the run
exists (at its first trace write, where MLflow looks up the server's version: `frozen`).

    python bench/tracking_deadline.py [--code DIR] [--cap 240] [--modes refuse,hang,drop,blackhole,slow,frozen]

Each case runs the demo (`+exp=demo` against the loopback stand-in optimizer, 0.2 s a reply, so the
run is created while calls are in flight) with `mlflow.tracking_uri` pointing at
reflact/testing/tracking_endpoint.py's failing server or proxy, and prints the seconds from the
stage's end (summary.json's `times.ended_at`: the last reply) to the process's exit, and the exit
code. `--code DIR` runs another checkout's reflact (a before/after comparison); `--cap` stops a run
that waits longer (then the figure reads `> cap`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import BASE_ENV  # noqa: E402
from reflact.testing.optimizer_server import OptimizerServer, Response, chat_body, default_reply  # noqa: E402
from reflact.testing.tracking_endpoint import MODES, FailingTracking, SlowProxy  # noqa: E402

# a real server behind SlowProxy: (delay per request, the request it freezes at)
PROXIED = {"slow": (1.0, ()), "frozen": (0.0, ("/version",))}


@contextlib.contextmanager
def tracking(mode: str, root: Path):
    """The tracking URI of the case: a failing endpoint, or a real server behind a proxy."""
    if mode not in PROXIED:
        with FailingTracking(mode) as failing:
            yield failing.uri
        return
    import mlflow

    store = root / "server.db"
    mlflow.MlflowClient(tracking_uri=f"sqlite:///{store}").search_experiments()
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            f"sqlite:///{store}",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--artifacts-destination",
            str(root / "artifacts"),
        ],
        cwd=root,
        env={**BASE_ENV, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(f"http://127.0.0.1:{port}/health")
        delay, freeze_on = PROXIED[mode]
        with SlowProxy(f"http://127.0.0.1:{port}", delay_s=delay, freeze_on=freeze_on) as proxy:
            yield proxy.uri
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(url: str) -> None:
    for _ in range(600):
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not answer")


def one_case(mode: str, code: Path, cap_s: float) -> str:
    with (
        tempfile.TemporaryDirectory() as launch,
        OptimizerServer(
            lambda body, n: Response(body=chat_body(json.dumps(default_reply(body))), delay_s=0.2)
        ) as server,
        tracking(mode, Path(launch)) as uri,
    ):
        run_dir = Path(launch) / "run"
        command = [
            sys.executable,
            "-m",
            "reflact.run",
            "+exp=demo",
            f"optimizer.base_url={server.base_url}",
            "optimizer.model=test",
            f"mlflow.tracking_uri={uri}",
            f"hydra.run.dir={run_dir}",
        ]
        env = {**os.environ, "PYTHONPATH": str(code), "MLFLOW_DISABLE_TELEMETRY": "true"}
        started = time.time()
        try:
            proc = subprocess.run(command, cwd=launch, env=env, capture_output=True, text=True, timeout=cap_s)
        except subprocess.TimeoutExpired:
            return f"{mode:10} > {cap_s:.0f} s after the stage (stopped at the cap)"
        ended = time.time()
        summary = json.loads((run_dir / "summary.json").read_text())
        last_reply = summary["times"]["ended_at"]
        warnings = sum("MLflow" in line and "WARNING" in line for line in proc.stderr.splitlines())
        return (
            f"{mode:10} {ended - last_reply:6.1f} s after the stage (whole run {ended - started:.1f} s), "
            f"exit {proc.returncode}, {warnings} MLflow warning(s)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", type=Path, default=ROOT, help="the checkout whose reflact runs (default: this one)")
    parser.add_argument("--cap", type=float, default=240.0)
    parser.add_argument("--modes", default=",".join([*MODES, *PROXIED]))
    args = parser.parse_args()
    for mode in args.modes.split(","):
        print(one_case(mode, args.code.resolve(), args.cap), flush=True)


if __name__ == "__main__":
    main()
