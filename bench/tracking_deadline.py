"""How long a run waits at its end for a tracking server that fails: down (refused), frozen
(accepts, never answers), dropping connections, or a black hole (connecting never completes).

    python bench/tracking_deadline.py [--code DIR] [--cap 120] [--modes refuse,hang,drop,blackhole]

Each case runs the demo (`+exp=demo` against the loopback stand-in optimizer) with
`mlflow.tracking_uri` pointing at reflact/testing/tracking_endpoint.py's failing server, and
prints the seconds from the stage's end (summary.json's `times.ended_at`: the last reply) to the
process's exit, and the exit code. `--code DIR` runs another checkout's reflact (a before/after
comparison); `--cap` stops a run that waits longer (then the figure reads `> cap`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from reflact.testing.optimizer_server import OptimizerServer  # noqa: E402
from reflact.testing.tracking_endpoint import MODES, FailingTracking  # noqa: E402


def one_case(mode: str, code: Path, cap_s: float) -> str:
    with tempfile.TemporaryDirectory() as launch, OptimizerServer() as server, FailingTracking(mode) as tracking:
        run_dir = Path(launch) / "run"
        command = [
            sys.executable,
            "-m",
            "reflact.run",
            "+exp=demo",
            f"optimizer.base_url={server.base_url}",
            "optimizer.model=test",
            f"mlflow.tracking_uri={tracking.uri}",
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
    parser.add_argument("--cap", type=float, default=120.0)
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args()
    for mode in args.modes.split(","):
        print(one_case(mode, args.code.resolve(), args.cap), flush=True)


if __name__ == "__main__":
    main()
