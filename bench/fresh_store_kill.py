"""A tracker killed while it creates a fresh local store: is the store usable afterwards?

    python bench/fresh_store_kill.py [--code DIR] [--delays 0.2,0.5,1,1.5,2.5] [--repeat 3]

Each case starts the demo (`+exp=demo` against the loopback stand-in optimizer) in an empty launch
folder, waits until the store's file (or the copy reflact migrates beside it) appears, SIGKILLs the
run's tracker process that many seconds later, waits for the run, then opens `outputs/mlflow.db`
the way the next run would (MLflow's client, a search) and prints how many stores of each delay
could not be opened. `--code DIR` runs another checkout's reflact (a before/after comparison).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import BASE_ENV  # noqa: E402
from reflact.testing.optimizer_server import OptimizerServer  # noqa: E402


def tracker_of(pid: int) -> int | None:
    """The run's tracker process: its child running reflact.tracking.worker."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            if b"reflact.tracking.worker" in cmdline:
                return int(child)
    return None


def one_case(code: Path, delay_s: float) -> bool:
    """Whether the store was usable after its tracker was killed `delay_s` after its file appeared."""
    with tempfile.TemporaryDirectory() as launch, OptimizerServer() as server:
        outputs = Path(launch) / "outputs"
        env = {**BASE_ENV, "PYTHONPATH": str(code)}
        command = [
            sys.executable,
            "-m",
            "reflact.run",
            "+exp=demo",
            f"optimizer.base_url={server.base_url}",
            "optimizer.model=test",
            f"hydra.run.dir={Path(launch) / 'run'}",
        ]
        run = subprocess.Popen(command, cwd=launch, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not (outputs.is_dir() and any(p.name.startswith((".mlflow.db", "mlflow.db")) for p in outputs.iterdir())):
            if time.monotonic() > deadline or run.poll() is not None:
                break
            time.sleep(0.01)
        time.sleep(delay_s)
        tracker = tracker_of(run.pid)
        if tracker is not None:
            os.kill(tracker, signal.SIGKILL)
        run.wait(timeout=300)
        opened = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys, mlflow; mlflow.MlflowClient(tracking_uri=sys.argv[1]).search_runs(['0'])",
                f"sqlite:///{outputs / 'mlflow.db'}",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        return opened.returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", type=Path, default=ROOT, help="the checkout whose reflact runs (default: this one)")
    parser.add_argument("--delays", default="0.2,0.5,1,1.5,2.5")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for delay in (float(d) for d in args.delays.split(",")):
        broken = sum(not one_case(args.code.resolve(), delay) for _ in range(args.repeat))
        print(
            f"killed {delay:4.1f} s after the store's file appeared: {broken} of {args.repeat} stores unusable",
            flush=True,
        )


if __name__ == "__main__":
    main()
