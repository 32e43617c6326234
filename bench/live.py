"""What live MLflow tracking costs a user: whole-process times with MLflow on, as users run it.

    python bench/live.py [--repeat 3] [--latency 2.0] [--runs 200] [--scale-runs 50000] [--skip-reference]

MLflow on means the default: a sqlite store at <launch dir>/outputs/mlflow.db, its artifacts beside
it in outputs/mlartifacts (hard links to the run dir's files), every call traced. Each run starts
in a launch dir of its own.

1. A generated dataset of --runs runs (200: 26 calls at M=8) at --latency s per call, W=16, L=4,
   seed 42. Per repeat, interleaved (the order rotates between repeats), each in a fresh process:
     reflact, warm store   a copy of a store that already holds one run of this dataset (migrated,
                           experiment and prompts present), its artifact location moved to the new
                           launch dir: a user's second run
     reflact, fresh store  no mlflow.db yet (its schema migrations run during the calls)
     reflact, warm, untraced  the warm store with mlflow.trace_calls=false
     reflact, mlflow off   mlflow.enabled=false
     reference             skillopt 0.2.0's run_minibatch_reflect (bench/_ref_driver.py)
   Median and range of the whole-process time; ratios to the reference (targets for the warm store:
   <= 1.05 at 2 s of latency, <= 1.10 at 0.5 s). CPU and peak RSS include the tracker process,
   which the run stops at its end without waiting for it: the bench adopts it (Linux's child
   subreaper) and counts it when it ends.
2. Per run, the time from the last reply (the server's last arrival + latency) to the process's
   exit, split by run.log: to the last minibatch line, to the "done:" line (summary, the tracker
   logging the run's files and ending its run), to the exit (interpreter shutdown). Target for the
   warm store: <= 0.15 s.
3. The same command again on a finished run dir (0 calls: every patch reused; an MLflow run that
   already holds them is left as it is), and the reference's driver again on its patches dir.
   Target: <= 1.5 times the reference's.
4. At scale (--scale-runs runs, latency 0, W=16), once each: MLflow off, on, and on with
   mlflow.trace_calls=false (warm stores); tracking's share of the wall time, (on - off) / on; the
   disk MLflow adds (mlflow.db's growth over the copied store, and the artifact store counted by
   unique inodes not already in the run dir, directories included: hard links cost no space);
   the same after the same command again on that run dir (nothing changed: it should add nothing).

Generated datasets go to /dev/shm when there is one; launch and run dirs to the temp dir (disk).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sqlite3
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    BENCH,
    Server,
    adopt_orphans,
    make_dataset,
    median_text,
    reflact_cmd,
    rmtree,
    run_process,
    scratch,
)
from _sides import latency_floor_s, load, peer_launch, peer_store, run_compose_floor, run_peer  # noqa: E402
from reference import REF_VERSION, ensure_ref_venv, run_reference, same_minibatches  # noqa: E402

WARM, FRESH, OFF, REF = "reflact, warm store", "reflact, fresh store", "reflact, mlflow off", "reference"
UNTRACED = "reflact, warm, untraced"
# issue 39: the peer (bench/peer.py: skillopt's reflect in a user's script logging to MLflow, warm
# store, traces) and our stack's floors (bench/_compose_floor.py: Hydra composes reflact's config
# for the warm run's command line, then exits; the same plus `import mlflow`)
PEER, COMPOSE, COMPOSE_MLFLOW = "peer", "floor: compose", "floor: compose+mlflow"
PEER_TARGETS = {2.0: 0.80, 0.5: 0.75}  # reflact, warm store / the peer
TAIL_TARGETS = {2.0: 0.15, 0.5: 0.40}  # the warm store's last reply to exit
OFF_MARGIN_S = 0.10  # MLflow off <= the reference + the compose floor + this
# the warm store's whole process against the reference's (issue 39 keeps 2 s's of issue 23's; its
# 0.5 s one is replaced by the peer's); a rerun of a finished run dir against the reference's
RATIO_TARGETS = {2.0: 1.05}
RERUN_TARGET = 1.5
# the run stops its tracker process at its end without waiting for it: the bench adopts it
# (adopt_orphans) and waits this long for it to end, to count its CPU and memory with the run's
ORPHANS_S = 0.5
STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")


# ---------------------------------------------------------------- launch dirs and stores

def warm_store(work: Path, data: Path, server: Server, args) -> Path:
    """A store as a user's second run finds it: migrated by one whole run of this dataset."""
    launch = work / "warm-template"
    launch.mkdir(parents=True)
    proc = run_process(reflact_cmd(data, server.base_url, launch / "runs" / "warmup", mlflow=True,
                                   **settings(args)), cwd=launch, orphans_s=ORPHANS_S)
    if proc.returncode != 0:
        sys.exit(f"the warm-up run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return launch / "outputs" / "mlflow.db"


def new_launch(work: Path, name: str, store: Path | None = None) -> Path:
    """A fresh launch dir; with `store`, a copy of it as outputs/mlflow.db whose experiments keep
    their artifacts beside it (in this launch dir's outputs/mlartifacts, as for the store's owner)."""
    launch = work / name
    (launch / "outputs").mkdir(parents=True)
    if store is not None:
        db = launch / "outputs" / "mlflow.db"
        shutil.copyfile(store, db)
        location = (launch / "outputs" / "mlartifacts").resolve().as_uri()
        with sqlite3.connect(db) as connection:
            connection.execute("UPDATE experiments SET artifact_location = ? "
                               "WHERE artifact_location LIKE '%/mlartifacts'", (location,))
        connection.close()
    return launch


def settings(args) -> dict:
    return dict(workers=args.workers, minibatch_size=args.minibatch_size, edit_budget=args.edit_budget, seed=args.seed)


# ---------------------------------------------------------------- measured runs

def run_measured(data: Path, server: Server, launch: Path, run_dir: Path, latency: float, args, mlflow: bool,
                 extra: tuple[str, ...] = ()) -> dict:
    """`python -m reflact.run` from `launch`: its process figures, calls, and what followed the last reply."""
    server.reset()
    started_at = time.time()
    proc = run_process(reflact_cmd(data, server.base_url, run_dir, mlflow=mlflow, extra=extra, **settings(args)),
                       cwd=launch, orphans_s=ORPHANS_S if mlflow else 0.0)
    exited_at = started_at + proc.wall_s
    if proc.returncode != 0:
        sys.exit(f"reflact in {run_dir} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    stats = server.stats()
    if "MLflow logging" in proc.stderr and "failed" in proc.stderr:
        print(f"  note: a tracking warning in {run_dir.name}: "
              f"{next(line for line in proc.stderr.splitlines() if 'MLflow logging' in line)[-300:]}")
    record = run_dir / "mlflow_run.json"
    return {"proc": proc, "calls": stats["requests"], "run_dir": run_dir,
            "tail": tail(stats, latency, exited_at, run_dir),
            "mlflow_status": json.loads(record.read_text()).get("status") if record.is_file() else None,
            "left_as_is": "left as it is" in proc.stderr}


def tail(stats: dict, latency: float, exited_at: float, run_dir: Path | None = None) -> dict | None:
    """From the last reply to the exit; with a run.log, split at its last minibatch and "done:" lines."""
    if not stats.get("arrivals"):
        return None
    last_reply = max(stats["arrivals"]) + latency
    result = {"total": exited_at - last_reply}
    lines = (run_dir / "run.log").read_text(encoding="utf-8").splitlines() if run_dir else []
    progress = [when(line) for line in lines if re.search(r"\] - reflact: +\d+ of \d+ ended", line)]
    done = next((when(line) for line in lines if "] - done:" in line), None)
    if progress and done:
        result.update(to_last_minibatch=progress[-1] - last_reply, to_done=done - progress[-1],
                      to_exit=exited_at - done)
    return result


def when(line: str) -> float | None:
    match = STAMP.match(line)
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() if match else None


def run_ref(python: Path, data: Path, server: Server, work: Path, name: str, args) -> dict:
    """The reference's driver; its exit time is taken from just before the call (a millisecond early)."""
    started_at = time.time()
    ref = run_reference(python, data, server, work, name, args)
    ref["calls"] = ref["server"]["requests"]
    ref["tail"] = tail(ref["server"], args.latency, started_at + ref["proc"].wall_s)
    return ref


# ---------------------------------------------------------------- parts 1-3

def one_repeat(i: int, data: Path, server: Server, work: Path, stores: dict, python: Path | None, args) -> dict:
    """Part 1's variants in a rotated order, then part 3's reruns of what they left."""
    store = stores[WARM]
    launches = {WARM: new_launch(work, f"warm{i}", store), OFF: new_launch(work, f"off{i}")}
    if not args.core:
        launches.update({FRESH: new_launch(work, f"fresh{i}"), UNTRACED: new_launch(work, f"untraced{i}", store)})
    peer = peer_launch(work, f"peer{i}", stores[PEER])
    variants = [WARM, *([] if args.core else [FRESH, UNTRACED]), OFF, PEER, COMPOSE, COMPOSE_MLFLOW,
                *([REF] if python else [])]
    variants = variants[i % len(variants):] + variants[:i % len(variants)]
    got: dict = {"load": os.getloadavg()[0]}
    for name in variants:
        if name == REF:
            got[name] = run_ref(python, data, server, work, f"r{i}", args)
        elif name == PEER:
            ran = run_peer(data, server, peer, [(args.minibatch_size, args.edit_budget, args.seed)], args.workers)
            got[name] = {**ran, "tail": tail(ran["server"], args.latency, ran["started_at"] + ran["proc"].wall_s)}
        elif name in (COMPOSE, COMPOSE_MLFLOW):
            overrides = reflact_cmd(data, server.base_url, launches[WARM] / "runs" / "r", mlflow=True,
                                    **settings(args))[3:]
            got[name] = run_compose_floor(overrides, launches[WARM], with_mlflow=name == COMPOSE_MLFLOW)
        else:
            got[name] = run_measured(data, server, launches[name], launches[name] / "runs" / "r", args.latency, args,
                                     mlflow=name != OFF,
                                     extra=("mlflow.trace_calls=false",) if name == UNTRACED else ())
    for name in () if args.core else (WARM, OFF):
        got[f"rerun {name}"] = run_measured(data, server, launches[name], launches[name] / "runs" / "r",
                                            args.latency, args, mlflow=name != OFF)
    if python and not args.core:
        got[f"rerun {REF}"] = run_ref(python, data, server, work, f"r{i}", args)
        if i == 0:
            summary = json.loads((launches[WARM] / "runs" / "r" / "summary.json").read_text())
            same = same_minibatches(summary, got[REF]["minibatches"])
            print(f"  the same minibatches in reflact and the reference: {same}")
    for launch in [*launches.values(), peer]:
        rmtree(launch)
    return got


def print_part1(repeats: list[dict], args) -> None:
    print(f"\n1. whole process, latency {args.latency} s, {args.runs} runs (median and range of {len(repeats)})")
    print(f"  {'':22s} {'calls':>5}  {'process':32s} {'CPU':>7} {'peak RSS':>8}  MLflow run")
    for name in (WARM, FRESH, UNTRACED, OFF, PEER, REF):
        if name not in repeats[0]:
            continue
        runs = [r[name] for r in repeats]
        status = runs[-1].get("mlflow_status") or "-"
        print(f"  {name:22s} {runs[-1]['calls']:5d}  {median_text([r['proc'].wall_s for r in runs]):32s} "
              f"{statistics.median(r['proc'].cpu_s for r in runs):6.2f}s "
              f"{statistics.median(r['proc'].max_rss_mb for r in runs):6.0f}MB  {status}")
    if REF in repeats[0]:
        ref = statistics.median(r[REF]["proc"].wall_s for r in repeats)
        print("  ratios to the reference (medians):")
        for name in (WARM, FRESH, UNTRACED, OFF, PEER):
            if name not in repeats[0]:
                continue
            ratio = statistics.median(r[name]["proc"].wall_s for r in repeats) / ref
            target = RATIO_TARGETS.get(args.latency) if name == WARM else None
            print(f"    {name:22s} {ratio:.3f}{verdict(ratio, target)}")


def verdict(value: float, target: float | None) -> str:
    return f"   target <= {target:g}: {'ok' if value <= target else 'ABOVE TARGET'}" if target else ""


def print_part2(repeats: list[dict], args) -> None:
    print("\n2. from the last reply to the process's exit (medians; run.log's split: to the last minibatch line /"
          " to 'done:' / to the exit)")
    for name in (WARM, FRESH, UNTRACED, OFF, PEER, REF):
        tails = [r[name]["tail"] for r in repeats if name in r and r[name]["tail"]]
        if not tails:
            continue
        text = f"  {name:22s} {median_text([t['total'] for t in tails]):32s}"
        if all("to_done" in t for t in tails):
            parts = [statistics.median(t[k] for t in tails) for k in ("to_last_minibatch", "to_done", "to_exit")]
            text += " = " + " + ".join(f"{p:.3f}" for p in parts)
        if name == WARM:
            text += verdict(statistics.median(t["total"] for t in tails), TAIL_TARGETS.get(args.latency))
        print(text)


def print_part3(repeats: list[dict]) -> None:
    print("\n3. the same command again on the finished run dir (whole process)")
    if f"rerun {WARM}" not in repeats[0]:
        return
    for name in (WARM, OFF, REF):
        key = f"rerun {name}"
        if key not in repeats[0]:
            continue
        runs = [r[key] for r in repeats]
        left = ""
        if name == WARM:
            left = "   MLflow run left as it is: " + ("yes" if all(r["left_as_is"] for r in runs) else "NO")
        print(f"  {name:22s} calls {runs[-1]['calls']:3d}  {median_text([r['proc'].wall_s for r in runs]):32s} "
              f"peak RSS {statistics.median(r['proc'].max_rss_mb for r in runs):4.0f}MB{left}")
    if f"rerun {REF}" in repeats[0]:
        ref = statistics.median(r[f"rerun {REF}"]["proc"].wall_s for r in repeats)
        for name in (WARM, OFF):
            ours = statistics.median(r[f"rerun {name}"]["proc"].wall_s for r in repeats)
            print(f"  ratio {name} / reference: {ours / ref:.3f}{verdict(ours / ref, RERUN_TARGET)}")


def print_side_by_side(repeats: list[dict], args) -> None:
    """Issue 39's table: reflact against the peer, the reference and the floors, each ratio the
    median of the repeats' own ratios (measured side by side, minutes apart at most)."""
    n = len(repeats)
    loads = [r["load"] for r in repeats]
    print(f"\nside by side (issue 39), latency {args.latency} s, n={n}; 1-minute load at each repeat's start "
          f"{min(loads):.2f}-{max(loads):.2f}")
    wall = {name: [r[name]["proc"].wall_s for r in repeats] for name in (WARM, OFF, PEER, REF) if name in repeats[0]}
    wall.update({name: [r[name] for r in repeats] for name in (COMPOSE, COMPOSE_MLFLOW)})
    calls = repeats[-1][WARM]["calls"]
    floor = latency_floor_s(calls, args.workers, args.latency)
    print(f"  latency floor: ceil({calls} calls / {args.workers} workers) x {args.latency} s = {floor:.3f} s")
    for name in (COMPOSE, COMPOSE_MLFLOW, PEER, REF, OFF, WARM):
        if name in wall:
            print(f"  {name:24s} {median_text(wall[name])}")

    def ratio(a: str, b: str) -> list[float]:
        return [x / y for x, y in zip(wall[a], wall[b], strict=True)]

    rows = [(f"{WARM} / peer", ratio(WARM, PEER), PEER_TARGETS.get(args.latency), ""),
            (f"{WARM} / latency floor", [w / floor for w in wall[WARM]], None, ""),
            ("peer / latency floor", [w / floor for w in wall[PEER]], None, "")]
    if REF in wall:
        rows += [(f"{WARM} / reference", ratio(WARM, REF), RATIO_TARGETS.get(args.latency), ""),
                 ("peer / reference", ratio(PEER, REF), None, ""),
                 (f"{OFF} / reference", ratio(OFF, REF), None, "")]
    print("  measure (median of the per-repeat ratios, range)")
    for label, values, target, _ in rows:
        print(f"    {label:40s} {median_text(values, 'x'):30s}{verdict(statistics.median(values), target)}")
    if REF in wall:
        over = [o - r for o, r in zip(wall[OFF], wall[REF], strict=True)]
        allowed = statistics.median(wall[COMPOSE]) + OFF_MARGIN_S
        print(f"    {OFF + ' - reference':40s} {median_text(over):30s}   target <= compose floor + "
              f"{OFF_MARGIN_S:g} s = {allowed:.3f} s: {'ok' if statistics.median(over) <= allowed else 'ABOVE TARGET'}")
    tails = [r[WARM]["tail"]["total"] for r in repeats if r[WARM]["tail"]]
    peer_tails = [r[PEER]["tail"]["total"] for r in repeats if r[PEER]["tail"]]
    print(f"    {'last reply to exit, ' + WARM:40s} {median_text(tails):30s}"
          f"{verdict(statistics.median(tails), TAIL_TARGETS.get(args.latency))}")
    print(f"    {'last reply to exit, peer':40s} {median_text(peer_tails)}")


# ---------------------------------------------------------------- part 4: disk

def inodes(root: Path) -> set[tuple[int, int]]:
    found = set()
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            st = os.lstat(os.path.join(folder, name))
            found.add((st.st_dev, st.st_ino))
    return found


def own_bytes(root: Path, known: set[tuple[int, int]]) -> dict:
    """Bytes on disk under `root` (st_blocks) in inodes outside `known` (each counted once), and how
    many of its files are hard links to known files."""
    seen: set[tuple[int, int]] = set()
    result = {"bytes": 0, "files": 0, "linked": 0, "dirs": 0}
    if not root.exists():
        return result
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            st = os.lstat(os.path.join(folder, name))
            key = (st.st_dev, st.st_ino)
            is_file = name in files
            result["files" if is_file else "dirs"] += 1
            if key in known:
                result["linked"] += is_file
            elif key not in seen:
                seen.add(key)
                result["bytes"] += st.st_blocks * 512
    return result


def db_bytes(launch: Path) -> int:
    """mlflow.db and any journal beside it, as allocated on disk."""
    return sum(p.stat().st_blocks * 512 for p in (launch / "outputs").glob("mlflow.db*"))


def disk(launch: Path, run_dir: Path, db_before: int) -> dict:
    artifacts = own_bytes(launch / "outputs" / "mlartifacts", inodes(run_dir))
    return {"db": db_bytes(launch), "db_growth": db_bytes(launch) - db_before, "artifacts": artifacts,
            "run_dir": own_bytes(run_dir, set())["bytes"]}


# ---------------------------------------------------------------- part 4

SCALE_VARIANTS = (("mlflow off", False, ()), ("mlflow on", True, ()),
                  ("on, trace_calls=false", True, ("mlflow.trace_calls=false",)))


def scale_variant(data: Path, server: Server, work: Path, store: Path, label: str, mlflow: bool,
                  extra: tuple[str, ...], args) -> dict:
    launch = new_launch(work, "scale-" + re.sub(r"\W+", "_", label), store if mlflow else None)
    run_dir = launch / "runs" / "r"
    db_before = db_bytes(launch)
    try:
        first = run_measured(data, server, launch, run_dir, 0.0, args, mlflow, extra)
        first["disk"] = disk(launch, run_dir, db_before) if mlflow else None
        db_before = db_bytes(launch)
        again = run_measured(data, server, launch, run_dir, 0.0, args, mlflow, extra)
        again["disk"] = disk(launch, run_dir, db_before) if mlflow else None
        if mlflow:
            again["disk"]["artifacts_added"] = again["disk"]["artifacts"]["bytes"] - first["disk"]["artifacts"]["bytes"]
        return {"first": first, "again": again}
    finally:
        rmtree(launch)


def part4(work: Path, inputs: Path, store: Path, args) -> None:
    data = make_dataset(inputs / f"gen{args.scale_runs}", args.scale_runs)
    print(f"\n4. at scale: {args.scale_runs} runs, latency 0, W={args.workers}, once each", flush=True)
    rows = {}
    with Server(0.0) as server:
        for label, mlflow, extra in SCALE_VARIANTS:
            rows[label] = scale_variant(data, server, work, store, label, mlflow, extra, args)
            first, again = rows[label]["first"], rows[label]["again"]
            print(f"  {label:22s} calls {first['calls']:5d}  process {first['proc'].wall_s:7.1f} s  "
                  f"CPU {first['proc'].cpu_s:6.1f} s  peak RSS {first['proc'].max_rss_mb:5.0f} MB   "
                  f"again: calls {again['calls']}, {again['proc'].wall_s:5.1f} s, "
                  f"peak RSS {again['proc'].max_rss_mb:4.0f} MB", flush=True)
            left = ""
            if mlflow:
                left = f", left as it is by the same command again: {'yes' if again['left_as_is'] else 'NO'}"
            print(f"      after the last reply: {tail_text(first['tail'])}; MLflow run "
                  f"{first['mlflow_status'] or '-'}{left}")
            if first["disk"]:
                print_disk(first["disk"], again["disk"])
    rmtree(data)
    off = rows["mlflow off"]["first"]["proc"].wall_s
    for label in ("mlflow on", "on, trace_calls=false"):
        on = rows[label]["first"]["proc"].wall_s
        print(f"  tracking's share of the wall time, {label}: (on - off) / on = {(on - off) / on:.3f} "
              f"({on - off:+.1f} s)")


def tail_text(t: dict | None) -> str:
    if not t:
        return "-"
    text = f"{t['total']:.2f} s"
    if "to_done" in t:
        text += f" (to the last minibatch line {t['to_last_minibatch']:.2f} s, to 'done:' {t['to_done']:.2f} s, " \
                f"to the exit {t['to_exit']:.2f} s)"
    return text


def print_disk(first: dict, again: dict) -> None:
    mb = 1 / 2**20
    a = first["artifacts"]
    print(f"      disk: run dir {first['run_dir'] * mb:.1f} MB; MLflow adds mlflow.db "
          f"+{first['db_growth'] * mb:.1f} MB "
          f"(now {first['db'] * mb:.1f} MB) and artifacts {a['bytes'] * mb:.1f} MB of their own "
          f"({a['files']} files, {a['linked']} of them hard links into the run dir; {a['dirs']} folders)")
    print(f"      after the same command again: mlflow.db +{again['db_growth'] * mb:.2f} MB, artifacts "
          f"{again['artifacts_added'] * mb:+.2f} MB ({again['artifacts']['linked']} of {again['artifacts']['files']} "
          f"files still linked into the run dir)")


# ---------------------------------------------------------------- main

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="measurements per figure of parts 1-3 (median)")
    parser.add_argument("--latency", type=float, default=2.0, help="server latency per request, seconds")
    parser.add_argument("--runs", type=int, default=200, help="runs in the generated dataset of parts 1-3")
    parser.add_argument("--scale-runs", type=int, default=50000, help="runs in part 4's dataset (0: skip part 4)")
    parser.add_argument("--skip-reference", action="store_true", help="no reference runs")
    parser.add_argument("--core", action="store_true",
                        help="issue 39's variants only: no fresh store, no untraced run, no reruns (part 3)")
    parser.add_argument("--ref-venv", type=Path, default=BENCH / ".venv-ref")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("-M", "--minibatch-size", type=int, default=8)
    parser.add_argument("-L", "--edit-budget", type=int, default=4)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    if not adopt_orphans():
        print("note: this system cannot adopt orphans: the tracker's CPU and memory are not counted")
    python = None if args.skip_reference else ensure_ref_venv(args.ref_venv.resolve())
    work, inputs = scratch("live"), scratch("live-data", memory=True)
    try:
        data = make_dataset(inputs / f"gen{args.runs}", args.runs)
        print(f"W={args.workers}, M={args.minibatch_size}, L={args.edit_budget}, seed {args.seed}; python "
              f"{sys.version.split()[0]}; load average {os.getloadavg()[0]:.2f}; reference: "
              f"{'skipped' if python is None else 'skillopt ' + REF_VERSION}", flush=True)
        with Server(args.latency) as server:
            stores = {WARM: warm_store(work, data, server, args),
                      PEER: peer_store(work, data, server, [(args.minibatch_size, args.edit_budget, args.seed)],
                                       args.workers)}
            repeats = []
            for i in range(args.repeat):
                repeats.append(one_repeat(i, data, server, work, stores, python, args))
                print(f"  repeat {i + 1}/{args.repeat} done ({load()})", flush=True)
        print_part1(repeats, args)
        print_part2(repeats, args)
        print_part3(repeats)
        print_side_by_side(repeats, args)
        if args.scale_runs:
            part4(work, inputs, stores[WARM], args)
    finally:
        rmtree(work)
        rmtree(inputs)


if __name__ == "__main__":
    main()
