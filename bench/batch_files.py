"""Building and writing the batch files of a 27-cell sweep, against the same sweep's dry run.

    python bench/batch_files.py [--data DIR] [--repeat 3]

Both are whole `python -m reflact.run -m` commands over the real dataset and a 27-cell grid
(reflect.minibatch_size=2,4,8 x reflect.edit_budget=1,2,4 x reflect.seed=1,2,3), MLflow off:
- `dry run`: optimizer=dry_run, every job run through (prompts written, no call);
- `batch`: optimizer.execution=batch with optimizer.batch_wait=false against the loopback stand-in
  (its Batch API in this process, each batch left in progress): every job's requests found, the
  grid's input files written, uploaded and submitted as one batch, and the command returns.
The two alternate per repeat, each in a launch dir of its own. Prints the medians and their
ratio (target: batch <= 1.5 x dry run), and the batch's lines and files.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import DEFAULT_DATA, PY, check_data, rmtree, run_process, scratch  # noqa: E402

from reflact.testing.batch_server import BatchSettings  # noqa: E402
from reflact.testing.optimizer_server import OptimizerServer  # noqa: E402

GRID = ("reflect.minibatch_size=2,4,8", "reflect.edit_budget=1,2,4", "reflect.seed=1,2,3")


def timed(args: list[str], launch: Path) -> float:
    launch.mkdir(parents=True)
    done = run_process(args, cwd=launch)
    if done.returncode:
        sys.exit(f"{' '.join(args[:4])}... failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return done.wall_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the real dataset (default: %(default)s)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    data = check_data(args.data)
    work = scratch("batch-files")
    common = [PY, "-m", "reflact.run", "-m", f"data.dir={data}", "mlflow.enabled=false", *GRID]
    walls: dict[str, list[float]] = {"dry run": [], "batch": []}
    try:
        with OptimizerServer(batches=BatchSettings(delay_s=10**6)) as server:
            batch = [*common, "optimizer=compatible", f"optimizer.base_url={server.base_url}",
                     "optimizer.model=bench-model", "optimizer.execution=batch", "optimizer.batch_wait=false"]
            for n in range(args.repeat):
                walls["dry run"].append(timed([*common, "optimizer=dry_run"], work / f"dry{n}"))
                walls["batch"].append(timed(batch, work / f"batch{n}"))
            lines = sum(len(b["_lines"]) for b in server.batches.batches.values())
            batches, live = len(server.batches.batches), server.count
    finally:
        rmtree(work)
    print(f"27 cells over {data.name}, {args.repeat} repeats; python {sys.version.split()[0]}")
    for name, values in walls.items():
        print(f"  {name:8s} median {statistics.median(values):6.2f} s  (range {min(values):.2f}-{max(values):.2f})")
    ratio = statistics.median(walls["batch"]) / statistics.median(walls["dry run"])
    print(f"  batch / dry run: {ratio:.2f} (target <= 1.5)")
    print(f"  per batch sweep: {lines // args.repeat} lines in {batches // args.repeat} batch(es); "
          f"live requests: {live}")


if __name__ == "__main__":
    main()
