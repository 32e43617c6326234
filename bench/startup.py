"""Start-up cost of the command line: `--help`, and a run of one minibatch with and without MLflow.

    python bench/startup.py [--repeat 5]

Whole-process wall times (interpreter start to exit) of:
  --help                      `python -m reflact.run --help` (target: median < 1.5 s)
  1 minibatch, mlflow off     a 4-run dataset (one minibatch at M=8), loopback server with no latency
  1 minibatch, mlflow fresh   the same with MLflow on and a new sqlite store (its schema migrations included)
  1 minibatch, mlflow on      the same with MLflow on and an already-migrated store
Each is run --repeat times (a fresh store each time for the "fresh" row); the median is reported,
with the min and max. For runs, "in run" is counts.wall_time_s of summary.json (dataset, client,
stage, preview, summary; MLflow logging comes after it), so process - in run is the start-up,
Hydra and MLflow logging.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import PY, Server, make_dataset, reflact_cmd, rmtree, run_process, scratch  # noqa: E402


def row(label: str, walls: list[float], extra: str = "") -> str:
    return (f"  {label:28s} median {statistics.median(walls):6.3f} s   min {min(walls):6.3f}   max {max(walls):6.3f}"
            f"   (n={len(walls)}){extra}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    work = scratch("startup")
    try:
        data = make_dataset(work / "tiny", runs=4, fail_share=1.0)  # 4 failures: one minibatch at M=8
        print(f"python {sys.version.split()[0]}, {args.repeat} runs each\n")

        helps = []
        for _ in range(args.repeat):
            proc = run_process([PY, "-m", "reflact.run", "--help"], cwd=work)
            if proc.returncode != 0 or "reflect" not in proc.stdout:
                sys.exit(f"--help failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
            helps.append(proc.wall_s)
        verdict = "ok" if statistics.median(helps) < 1.5 else "ABOVE TARGET"
        print(row("--help", helps, f"   target < 1.5 s: {verdict}"))

        with Server(0.0) as server:
            cases = (("1 minibatch, mlflow off", False, False), ("1 minibatch, mlflow fresh", True, True),
                     ("1 minibatch, mlflow on", True, False))
            migrated = work / "migrated"
            for label, mlflow, fresh in cases:
                walls, inner, rss = [], [], []
                for i in range(args.repeat):
                    launch = (work / f"{label.replace(' ', '_').replace(',', '')}_{i}" if fresh or not mlflow
                              else migrated)
                    launch.mkdir(parents=True, exist_ok=True)
                    if mlflow and not fresh and i == 0:  # migrate the store once, untimed
                        warm = run_process(reflact_cmd(data, server.base_url, launch / "runs" / "warm", mlflow=True),
                                           cwd=launch)
                        if warm.returncode != 0:
                            sys.exit(f"warm-up run failed:\n{warm.stderr[-2000:]}")
                    run_dir = launch / "runs" / f"r{i}"
                    proc = run_process(reflact_cmd(data, server.base_url, run_dir, mlflow=mlflow), cwd=launch)
                    if proc.returncode != 0:
                        sys.exit(f"{label} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
                    counts = json.loads((run_dir / "summary.json").read_text())["counts"]
                    if counts["calls"] != 1:
                        sys.exit(f"{label}: expected one call, got {counts['calls']}")
                    walls.append(proc.wall_s)
                    inner.append(counts["wall_time_s"])
                    rss.append(proc.max_rss_mb)
                print(row(label, walls, f"   in run {statistics.median(inner):.3f} s, "
                                        f"peak RSS {statistics.median(rss):.0f} MB"))
    finally:
        rmtree(work)


if __name__ == "__main__":
    main()
