"""Time from the start of `python -m reflact.run` to its one-line error, for an endpoint that cannot
be used: a closed loopback port, and a server that answers 401 (or 404) to every request.

    python bench/dead_endpoint.py [--repeat 3] [--mlflow]

Each case runs the demo in a fresh temporary launch dir (MLflow off unless --mlflow: its store's
first use is timed separately by bench/startup.py) and prints the seconds until each stderr line,
the exit code and the number of requests the server saw.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from reflact.testing.optimizer_server import OptimizerServer, Response  # noqa: E402


def closed_port() -> str:
    with socket.socket() as sock:  # bound then closed: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def timed_run(base_url: str, mlflow: bool) -> tuple[float, int, list[tuple[float, str]]]:
    with tempfile.TemporaryDirectory() as launch:
        command = [sys.executable, "-m", "reflact.run", "+exp=demo", "optimizer=compatible",
                   f"optimizer.base_url={base_url}", "optimizer.model=test", f"mlflow.enabled={str(mlflow).lower()}"]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_DISABLE_TELEMETRY": "true"}
        started = time.monotonic()
        proc = subprocess.Popen(command, cwd=launch, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                text=True)
        lines = [(time.monotonic() - started, line.rstrip()) for line in proc.stderr]
        code = proc.wait()
        return time.monotonic() - started, code, lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--mlflow", action="store_true")
    args = parser.parse_args()
    cases = [("closed port", None), ("HTTP 401", 401), ("HTTP 404", 404)]
    for name, status in cases:
        for _ in range(args.repeat):
            if status is None:
                total, code, lines = timed_run(closed_port(), args.mlflow)
                requests = 0
            else:
                script = lambda request, number, status=status: Response(status, {"error": {"message": "no"}})  # noqa: E731
                with OptimizerServer(script) as server:
                    total, code, lines = timed_run(server.base_url, args.mlflow)
                    requests = server.count
            print(f"{name}: exit {code} after {total:.2f} s, {requests} request(s); the error line at "
                  f"{lines[-1][0]:.2f} s: {lines[-1][1][:110]}")


if __name__ == "__main__":
    main()
