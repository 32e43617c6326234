"""A sweep with MLflow on, as users run it: the working tree against another revision, side by side.

    python bench/sweep.py BASE_REV [--repeat 3] [--latency 0.5] [--runs 40]

Runs `python -m reflact.run -m` over a 3 x 3 grid (reflect.minibatch_size=2,4,8 x
reflect.edit_budget=1,2,4: nine jobs, one after another in Hydra's basic launcher) on a generated
dataset, against the loopback optimizer at --latency s a call, with the default sqlite store
(a copy of an already-migrated one: a user's second sweep) and every call traced. The working
tree and BASE_REV (exported with `git archive`) alternate per repeat, each in a launch dir of
its own. Prints per version the median and range of the whole sweep's wall time and CPU time
(the sweep's process and its children, the tracker processes among them), and their ratios.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import BASE_ENV, PY, REPO, Server, make_dataset, reflact_cmd, rmtree, run_process  # noqa: E402
from same_outputs import export  # noqa: E402

GRID = ("reflect.minibatch_size=2,4,8", "reflect.edit_budget=1,2,4")


def sweep(tree: Path, data: Path, launch: Path, url: str) -> tuple[float, float]:
    """One sweep: its wall time and the CPU time of it and its children."""
    env = {**BASE_ENV, "PYTHONPATH": str(tree)}
    args = [PY, "-m", "reflact.run", "-m", f"data.dir={data}", "optimizer=compatible", f"optimizer.base_url={url}",
            "optimizer.model=bench-model", "optimizer.cache=off", "reflect.workers=16", *GRID]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run(args, cwd=launch, env=env, capture_output=True, text=True)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        sys.exit(f"the sweep of {tree} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def migrated_store(work: Path, data: Path, url: str) -> Path:
    """A store as a user's second sweep finds it: migrated, the experiment present."""
    launch = work / "warm"
    launch.mkdir()
    done = run_process(reflact_cmd(data, url, launch / "run", mlflow=True), cwd=launch)
    if done.returncode:
        sys.exit(f"the warm-up run failed:\n{done.stderr[-3000:]}")
    return launch / "outputs" / "mlflow.db"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="the revision to compare with (e.g. HEAD~1)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--latency", type=float, default=0.5)
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="reflact-bench-sweep-"))
    try:
        trees = {"working tree": REPO, args.base: export(args.base, work)}
        data = make_dataset(work / "data", runs=args.runs)
        figures: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
        with Server(args.latency) as server:
            store = migrated_store(work, data, server.base_url)
            for i in range(args.repeat):
                order = list(trees.items()) if i % 2 == 0 else list(trees.items())[::-1]
                for name, tree in order:
                    launch = work / f"launch-{i}-{len(figures[name])}-{abs(hash(name))}"
                    (launch / "outputs").mkdir(parents=True)
                    shutil.copy(store, launch / "outputs" / "mlflow.db")
                    figures[name].append(sweep(tree, data, launch, server.base_url))
                    print(f"  {name}: {figures[name][-1][0]:.2f} s wall, {figures[name][-1][1]:.2f} s CPU", flush=True)
        print(f"\n3 x 3 sweep, basic launcher, {args.runs} runs, latency {args.latency} s, MLflow on "
              f"(warm sqlite store, traces), n={args.repeat}, medians [range]")
        medians = {}
        for name, rows in figures.items():
            walls, cpus = [w for w, _ in rows], [c for _, c in rows]
            medians[name] = (statistics.median(walls), statistics.median(cpus))
            print(f"  {name:14s} wall {medians[name][0]:6.2f} s [{min(walls):.2f}-{max(walls):.2f}]"
                  f"   CPU {medians[name][1]:6.2f} s [{min(cpus):.2f}-{max(cpus):.2f}]")
        ours, theirs = medians["working tree"], medians[args.base]
        print(f"  working tree / {args.base}: wall {ours[0] / theirs[0]:.3f}, CPU {ours[1] / theirs[1]:.3f}")
    finally:
        rmtree(work)


if __name__ == "__main__":
    main()
