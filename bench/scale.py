"""How reflact scales with the dataset: wall time, overhead per minibatch, peak memory.

    python bench/scale.py [--sizes 1000,10000,50000] [--latency 0] [--workers 16]

For each size a dataset is generated (bench/make_dataset.py, 8 steps per run, 60 % failures)
and `python -m reflact.run` runs on it as a subprocess against a loopback server answering
after --latency seconds (mlflow.enabled=false, optimizer.cache=off). Reported per size:
process wall time, counts.wall_time_s of summary.json ("run"), the overhead per minibatch
(run/mb: counts.wall_time_s / minibatches; stage/mb: the stage's span in run.log / minibatches;
with no latency, all of it is reflact's and the server's work; W calls are in flight at once),
the process's CPU time and its peak RSS (ru_maxrss of wait4 on the child). The first size is
the baseline of the ratios; target: peak(largest) / peak(smallest) <= 2.

Generated data goes to /dev/shm when it exists (it is only read); run dirs to the temp dir.
Both are deleted after each size. 50,000 runs take ~200 MB of data and ~300 MB of run dir.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Server, make_dataset, rmtree, run_reflact, scratch  # noqa: E402


def phases(p: dict | None) -> str:
    if not p:
        return "-"
    return f"{p['startup_load_s']:.1f} s / {p['stage_s']:.1f} s / {p['post_s']:.1f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,50000",
                        help="comma-separated run counts; the first is the baseline")
    parser.add_argument("--latency", type=float, default=0.0, help="server latency per request, seconds")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("-M", "--minibatch-size", type=int, default=8)
    parser.add_argument("-L", "--edit-budget", type=int, default=4)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    work = scratch("scale")
    inputs = scratch("scale-data", memory=True)
    free = shutil.disk_usage(work).free / 2**30
    print(f"latency {args.latency} s, W={args.workers}, M={args.minibatch_size}, L={args.edit_budget}, "
          f"seed {args.seed}, mlflow off; python {sys.version.split()[0]}; {free:.0f} GiB free in {work.parent}\n")
    print(f"  {'runs':>7} {'minibatches':>11} {'process':>9} {'run':>9} {'run/mb':>9} {'stage/mb':>9} {'CPU':>8} "
          f"{'peak RSS':>9} {'peak ratio':>10}   phases (run.log): start-up+load / stage / preview+summary")
    rows = []
    try:
        with Server(args.latency) as server:
            for size in sizes:
                started = time.perf_counter()
                data = make_dataset(inputs / f"gen{size}", size)
                generated = time.perf_counter() - started
                result = run_reflact(data, server, work, f"run{size}", workers=args.workers,
                                     minibatch_size=args.minibatch_size, edit_budget=args.edit_budget, seed=args.seed)
                proc, counts = result["proc"], result["counts"]
                if counts["minibatches_failed"]:
                    print(f"  note: {counts['minibatches_failed']} minibatch(es) failed at {size}")
                per_mb = counts["wall_time_s"] / counts["minibatches"]
                stage_mb = result["phases"]["stage_s"] / counts["minibatches"] if result["phases"] else float("nan")
                rows.append((size, counts, proc, per_mb, stage_mb))
                base_rss = rows[0][2].max_rss_mb
                print(f"  {size:7d} {counts['minibatches']:11d} {proc.wall_s:8.1f}s {counts['wall_time_s']:8.1f}s "
                      f"{per_mb * 1000:6.1f} ms {stage_mb * 1000:6.1f} ms {proc.cpu_s:7.1f}s {proc.max_rss_mb:7.0f}MB "
                      f"{proc.max_rss_mb / base_rss:10.2f}   {phases(result['phases'])}", flush=True)
                print(f"          (data generated in {generated:.0f} s)", flush=True)
                started = time.perf_counter()
                rmtree(result["run_dir"])
                rmtree(data)
                print(f"          (deleted in {time.perf_counter() - started:.0f} s)", flush=True)
    finally:
        rmtree(work)
        rmtree(inputs)
    if len(rows) > 1:
        (s0, _, p0, m0, g0), (s1, _, p1, m1, g1) = rows[0], rows[-1]
        ratio = p1.max_rss_mb / p0.max_rss_mb
        print(f"\npeak RSS {s1} / {s0}: {p1.max_rss_mb:.0f} / {p0.max_rss_mb:.0f} MB = {ratio:.2f} "
              f"(target <= 2: {'ok' if ratio <= 2 else 'ABOVE TARGET'})")
        print(f"run wall time per minibatch {s1} / {s0}: {m1 * 1000:.1f} / {m0 * 1000:.1f} ms = {m1 / m0:.2f}; "
              f"stage only: {g1 * 1000:.1f} / {g0 * 1000:.1f} ms = {g1 / g0:.2f}")


if __name__ == "__main__":
    main()
