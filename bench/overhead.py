"""Overhead of the reflect stage over the optimizer's own latency.

    python bench/overhead.py [--latency 0.5] [--workers 16] [--runs 2000] [--data DIR] [--repeat 1]

A loopback server (its own process) answers every call after --latency seconds. With W workers
the best possible wall time is ideal = ceil(calls / W) x latency; the ratio wall / ideal is the
overhead (target: <= 1.05 for the stage at 0.5 s and 16 workers). Measured on the real dataset
(../shared/data/reflexion_hotpotqa_react) and on a generated one of --runs runs, each in a
fresh process:

  stage     reflact.running.stage.Stage.run() alone (bench/_stage_child.py; the client built before the clock)
  run       counts.wall_time_s of summary.json of `python -m reflact.run` (load, client, stage, preview, summary)
  process   the whole `python -m reflact.run` process (interpreter, imports, Hydra, everything)
  floor     the same number of bare OpenAI SDK requests of the same size, W at a time, nothing else
            (bench/_sdk_floor.py): what the SDK and the server cost any Python client
With --repeat N each is measured N times and the median is reported (with the range).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    Server,
    chars_per_call,
    ideal_s,
    median_text,
    run_reflact,
    run_sdk_floor,
    run_stage,
    side_by_side_inputs,
    stage_arguments,
)


def timeline(stage: dict, latency: float) -> str:
    """When the first request reached the server, and how long after the last reply the stage ended."""
    arrivals = stage["server"].get("arrivals") or []
    if not arrivals:
        return ""
    first = min(arrivals) - stage["started_at"]
    tail = stage["started_at"] + stage["wall_s"] - (max(arrivals) + latency)
    return f"first request {first * 1000:.0f} ms after the start, end {tail * 1000:.0f} ms after the last reply"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    stage_arguments(parser)
    parser.add_argument("--repeat", type=int, default=1, help="measurements per figure; the median is reported")
    args = parser.parse_args()
    with side_by_side_inputs(args, "overhead") as (datasets, work, settings):
        rows = []
        with Server(args.latency) as server:
            for name, path in datasets:
                walls: dict[str, list[float]] = {"stage": [], "run": [], "process": [], "floor": []}
                for i in range(args.repeat):
                    cli = run_reflact(path, server, work, f"{name}_{i}", **settings)
                    stage = run_stage(path, server, work / "stage" / f"{name}_{i}", **settings)
                    calls = stage["server"]["requests"]
                    if cli["server"]["requests"] != calls or cli["counts"]["calls"] != calls or stage["failed"]:
                        print(f"  note: {name}: requests {cli['server']['requests']} (run) / {calls} (stage), "
                              f"counted {cli['counts']['calls']}, failed minibatches {stage['failed']}")
                    floor = run_sdk_floor(server, calls, round(chars_per_call(stage["server"])), args.workers, work)
                    walls["stage"].append(stage["wall_s"])
                    walls["run"].append(cli["counts"]["wall_time_s"])
                    walls["process"].append(cli["proc"].wall_s)
                    walls["floor"].append(floor)
                ideal = ideal_s(calls, args.workers, args.latency)
                rows.append((name, calls, ideal, walls))
                print(f"\n{name}: {cli['counts']['results']} runs, {calls} calls, "
                      f"{chars_per_call(stage['server']):.0f} prompt chars per call, "
                      f"ideal = ceil({calls}/{args.workers}) x {args.latency} s = {ideal:.3f} s")
                for label in ("stage", "run", "process", "floor"):
                    values = walls[label]
                    ratios = [v / ideal for v in values]
                    print(f"  {label:8s} {median_text(values):28s} wall/ideal {median_text(ratios, ''):26s}"
                          f" overhead {statistics.median(values) - ideal:+.3f} s")
                print(f"  stage timeline (last): {timeline(stage, args.latency)}")
                print(f"  process (last): {cli['proc'].cpu_s:.2f} s CPU, peak RSS {cli['proc'].max_rss_mb:.0f} MB")
        print("\nsummary, median wall/ideal (target for the stage <= 1.05):")
        for name, calls, ideal, walls in rows:
            r = {k: statistics.median(v) / ideal for k, v in walls.items()}
            verdict = "ok" if r["stage"] <= 1.05 else "ABOVE TARGET"
            print(f"  {name:26s} calls {calls:4d}  ideal {ideal:6.3f} s  stage {r['stage']:.3f} ({verdict})  "
                  f"run {r['run']:.3f}  process {r['process']:.3f}  SDK floor {r['floor']:.3f}")


if __name__ == "__main__":
    main()
