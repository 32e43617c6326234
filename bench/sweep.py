"""A sweep with MLflow on, as users run it, beside the peer's loop, the reference's and the floors.

    python bench/sweep.py [BASE_REV] [--repeat 3] [--latency 2.0] [--runs 40] [--jobs 3] [--skip-reference]

A 27-job grid (reflect.minibatch_size=2,4,8 x reflect.edit_budget=1,2,4 x reflect.seed=1,2,3) on
a generated dataset of --runs runs, against the loopback optimizer at --latency s a call, W=16.
Per repeat, interleaved (the order rotates between repeats), each in a launch dir of its own:

  reflact, basic       `python -m reflact.run -m ...`: Hydra's basic launcher (one job after another
                       in one process), MLflow on with the default sqlite store (a copy of an
                       already-migrated one: a user's second sweep), every call traced
  reflact, joblib N    the same with `hydra/launcher=joblib hydra.launcher.n_jobs=N` (--jobs)
  peer loop            bench/peer.py over the same 27 cells in one process (an MLflow run per
                       cell, autologged traces, its own warm store)
  reference loop       skillopt 0.2.0's run_minibatch_reflect over the same cells in one process
                       (bench/_ref_driver.py --cells; its own venv, bench/.venv-ref; logs nothing)
  floor: compose       bench/_compose_floor.py: Hydra composes reflact's config for the first
                       job's command line and exits; floor: compose+mlflow, the same and `import mlflow`
  BASE_REV, basic      with BASE_REV: the basic launcher's sweep at that revision (`git archive`)

Prints per variant the median and range of the wall time and the CPU time (the process and the
children it waited for), the latency floor (the cells' ceil(calls / W) x latency, one after
another, and that sum / N for N at once), and the ratios of issue 39 (targets: basic <= 0.90 x the
peer's loop, joblib with 3 at once <= 0.40 x), each the median of the repeats' own ratios.
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

from _common import (  # noqa: E402
    BASE_ENV,
    BENCH,
    PY,
    REPO,
    Server,
    make_dataset,
    median_text,
    reflact_cmd,
    rmtree,
    run_process,
)
from _sides import (  # noqa: E402
    TEMPLATES,
    cell_calls,
    latency_floor_s,
    load,
    peer_launch,
    peer_store,
    run_compose_floor,
    skillopt_env,
)
from reference import REF_VERSION, ensure_ref_venv  # noqa: E402
from same_outputs import export  # noqa: E402

SIZES, BUDGETS, SEEDS = (2, 4, 8), (1, 2, 4), (1, 2, 3)
CELLS = [(m, l_, s) for m in SIZES for l_ in BUDGETS for s in SEEDS]
GRID = tuple(f"reflect.{key}={','.join(map(str, values))}"
             for key, values in (("minibatch_size", SIZES), ("edit_budget", BUDGETS), ("seed", SEEDS)))
WORKERS = 16
BASIC, PEER, REF = "reflact, basic", "peer loop", "reference loop"
COMPOSE, COMPOSE_MLFLOW = "floor: compose", "floor: compose+mlflow"
TARGETS = {BASIC: 0.90}  # / the peer's loop; the joblib launcher's: JOBLIB_TARGET
JOBLIB_TARGET = 0.40


def timed(cmd: list[str], cwd: Path, env: dict, what: str) -> tuple[float, float]:
    """(wall, CPU of the process and the children it waited for) of one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        sys.exit(f"{what} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def reflact_sweep(tree: Path, data: Path, launch: Path, url: str, extra: tuple[str, ...] = ()) -> tuple[float, float]:
    env = {**BASE_ENV, "PYTHONPATH": str(tree)}
    cmd = [PY, "-m", "reflact.run", "-m", f"data.dir={data}", "optimizer=compatible", f"optimizer.base_url={url}",
           "optimizer.model=bench-model", "optimizer.cache=off", f"reflect.workers={WORKERS}", *GRID, *extra]
    return timed(cmd, launch, env, f"the sweep of {tree} in {launch}")


def peer_loop(data: Path, launch: Path, server: Server) -> tuple[float, float]:
    cmd = [PY, str(BENCH / "peer.py"), "--data", str(data), "--out", str(launch / "patches"), *TEMPLATES,
           "--workers", str(WORKERS), "--cells", *(",".join(map(str, c)) for c in CELLS)]
    return timed(cmd, launch, skillopt_env(server), f"the peer's loop in {launch}")


def reference_loop(python: Path, data: Path, launch: Path, server: Server) -> tuple[float, float]:
    cmd = [str(python), str(BENCH / "_ref_driver.py"), "--data", str(data), "--patches", str(launch / "patches"),
           "--result", str(launch / "result.json"), *TEMPLATES, "--workers", str(WORKERS),
           "--cells", *(",".join(map(str, c)) for c in CELLS)]
    return timed(cmd, launch, skillopt_env(server), f"the reference's loop in {launch}")


def migrated_store(work: Path, data: Path, url: str) -> Path:
    """A store as a user's second sweep finds it: migrated, the experiment present."""
    launch = work / "warm"
    launch.mkdir()
    done = run_process(reflact_cmd(data, url, launch / "run", mlflow=True), cwd=launch)
    if done.returncode:
        sys.exit(f"the warm-up run failed:\n{done.stderr[-3000:]}")
    return launch / "outputs" / "mlflow.db"


def one_repeat(i: int, variants: list[str], trees: dict, data: Path, work: Path, stores: dict, server: Server,
               python: Path | None, jobs: int) -> dict:
    order = variants[i % len(variants):] + variants[:i % len(variants)]
    got: dict = {"load": load()}
    for name in order:
        launch = work / f"launch-{i}-{order.index(name)}"
        if name == PEER:
            launch = peer_launch(work, launch.name, stores[PEER])
        else:
            (launch / "outputs").mkdir(parents=True)
        if name == PEER:
            got[name] = peer_loop(data, launch, server)
        elif name == REF:
            got[name] = reference_loop(python, data, launch, server)
        elif name in (COMPOSE, COMPOSE_MLFLOW):
            first = reflact_cmd(data, server.base_url, launch / "run", mlflow=True, workers=WORKERS,
                                minibatch_size=CELLS[0][0], edit_budget=CELLS[0][1], seed=CELLS[0][2])[3:]
            got[name] = (run_compose_floor(first, launch, with_mlflow=name == COMPOSE_MLFLOW), 0.0)
        else:
            shutil.copy(stores[BASIC], launch / "outputs" / "mlflow.db")
            parallel = name.endswith(f"joblib {jobs}")
            extra = ("hydra/launcher=joblib", f"hydra.launcher.n_jobs={jobs}") if parallel else ()
            got[name] = reflact_sweep(trees[name], data, launch, server.base_url, extra)
        print(f"  {i + 1}: {name:26s} {got[name][0]:7.2f} s wall, {got[name][1]:6.2f} s CPU   ({load()})", flush=True)
        rmtree(launch)
    return got


def report(repeats: list[dict], variants: list[str], data: Path, latency: float, jobs: int, base: str | None) -> None:
    joblib = f"reflact, joblib {jobs}"
    print(f"\n27-job sweep (M x L x seed), {len(repeats)} repeats, latency {latency} s, W={WORKERS}, MLflow on "
          f"(warm sqlite store, traces); medians [range]; load at each repeat's start: "
          + "; ".join(r["load"] for r in repeats))
    sequential = sum(latency_floor_s(cell_calls(data, m), WORKERS, latency) for m, _, _ in CELLS)
    print(f"  latency floor: {sequential:.1f} s one cell after another ({sum(cell_calls(data, m) for m, _, _ in CELLS)}"
          f" calls), {sequential / jobs:.1f} s {jobs} at once (that sum / {jobs})")
    for name in variants:
        walls, cpus = [r[name][0] for r in repeats], [r[name][1] for r in repeats]
        cpu = f"   CPU {median_text(cpus)}" if any(cpus) else ""
        print(f"  {name:26s} wall {median_text(walls):34s}{cpu}")

    def ratio(a: str, b: str) -> list[float]:
        return [r[a][0] / r[b][0] for r in repeats]

    print("  ratios (median of the per-repeat ratios, range)")
    rows = [(f"{BASIC} / peer loop", ratio(BASIC, PEER), TARGETS[BASIC]),
            (f"{joblib} / peer loop", ratio(joblib, PEER), JOBLIB_TARGET)]
    if REF in variants:
        rows += [(f"{BASIC} / reference loop", ratio(BASIC, REF), None),
                 ("peer loop / reference loop", ratio(PEER, REF), None)]
    rows += [(f"{BASIC} / latency floor", [r[BASIC][0] / sequential for r in repeats], None),
             (f"{joblib} / latency floor, {jobs} at once", [r[joblib][0] * jobs / sequential for r in repeats], None),
             ("peer loop / latency floor", [r[PEER][0] / sequential for r in repeats], None)]
    if base:
        rows.append((f"{BASIC} / {base}, basic", ratio(BASIC, f"{base}, basic"), None))
    for label, values, target in rows:
        met = "" if target is None else f"   target <= {target:g}: " + (
            "ok" if statistics.median(values) <= target else "ABOVE TARGET")
        print(f"    {label:42s} {median_text(values, 'x'):30s}{met}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", nargs="?", help="a revision to compare with as well (e.g. HEAD~1)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--latency", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--jobs", type=int, default=3, help="the joblib launcher's jobs at once")
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument("--ref-venv", type=Path, default=BENCH / ".venv-ref")
    args = parser.parse_args()
    python = None if args.skip_reference else ensure_ref_venv(args.ref_venv.resolve())
    work = Path(tempfile.mkdtemp(prefix="reflact-bench-sweep-"))
    try:
        joblib = f"reflact, joblib {args.jobs}"
        trees = {BASIC: REPO, joblib: REPO}
        if args.base:
            trees[f"{args.base}, basic"] = export(args.base, work)
        variants = [*trees, PEER, *([REF] if python else []), COMPOSE, COMPOSE_MLFLOW]
        data = make_dataset(work / "data", runs=args.runs)
        reference = "skipped" if python is None else f"skillopt {REF_VERSION}"
        print(f"python {sys.version.split()[0]}; reference: {reference}; {load()}", flush=True)
        with Server(args.latency) as server:
            stores = {BASIC: migrated_store(work, data, server.base_url),
                      PEER: peer_store(work, data, server, CELLS[:1], WORKERS)}
            repeats = [one_repeat(i, variants, trees, data, work, stores, server, python, args.jobs)
                       for i in range(args.repeat)]
        report(repeats, variants, data, args.latency, args.jobs, args.base)
    finally:
        rmtree(work)


if __name__ == "__main__":
    main()
