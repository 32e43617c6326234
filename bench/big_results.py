"""A very large results file, as a dry run: do time and peak memory grow linearly with its lines?

    python bench/big_results.py [--sizes 125000,250000,500000,1000000] [--with-conversations 0]

Each size is a results.jsonl of that many scored runs (60 % failures) whose conversations are
missing, so every run is read, checked, sorted, planned into minibatches (M=8) and counted as
skipped, and every minibatch is settled, recorded and reported: the whole pipeline but the calls
and prompts. `--with-conversations N` also gives the first N runs a conversation (prompts are then
built for them). Each size runs `python -m reflact.run ... optimizer=dry_run mlflow.enabled=false`
in a fresh process; printed per size: lines, minibatches, wall and CPU time, peak RSS, and the
ratio of each to the previous size (about 2 for each doubling when linear).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import PY, rmtree, run_process, scratch  # noqa: E402

SKILL = "# Skill\n\n- Check the order before a refund.\n- Amounts are in cents.\n"


def write_results(folder: Path, lines: int, with_conversations: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "skill.md").write_text(SKILL, encoding="utf-8")
    with open(folder / "results.jsonl", "w", encoding="utf-8") as handle:
        for i in range(lines):
            failed = rng.random() < 0.6
            row = {"id": f"r{i:07d}", "hard": 0 if failed else 1, "task_description": f"task {i}",
                   "fail_reason": "wrong amount" if failed else "", "n_turns": 4}
            handle.write(json.dumps(row) + "\n")
    for i in range(with_conversations):
        run = folder / "predictions" / f"r{i:07d}"
        run.mkdir(parents=True, exist_ok=True)
        (run / "conversation.json").write_text(json.dumps([{"role": "user", "content": f"order {i}"},
                                                           {"role": "assistant", "content": "done"}]))
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="125000,250000,500000,1000000")
    parser.add_argument("--with-conversations", type=int, default=0)
    args = parser.parse_args()
    data_root, work = scratch("bigres-data", memory=True), scratch("bigres")
    rows = []
    try:
        for size in (int(s) for s in args.sizes.split(",")):
            data = write_results(data_root / str(size), size, min(args.with_conversations, size))
            run_dir = work / f"run{size}"
            proc = run_process([PY, "-m", "reflact.run", f"data.dir={data}", "optimizer=dry_run",
                                "mlflow.enabled=false", "data.max_file_mb=1024", f"hydra.run.dir={run_dir}"], cwd=work)
            if proc.returncode != 0:
                sys.exit(f"the run of {size} lines failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
            counts = json.loads((run_dir / "summary.json").read_text())["counts"]
            rows.append((size, counts["minibatches"], proc.wall_s, proc.cpu_s, proc.max_rss_mb))
            print(f"{size:>9,} lines  {counts['minibatches']:>7,} minibatches  {proc.wall_s:7.1f} s wall  "
                  f"{proc.cpu_s:7.1f} s CPU  {proc.max_rss_mb:6.0f} MB peak", flush=True)
            rmtree(run_dir)
            rmtree(data)
    finally:
        rmtree(work)
        rmtree(data_root)
    print("\nratio to the previous size (lines, wall, CPU, peak RSS):")
    for (s0, _, w0, c0, r0), (s1, _, w1, c1, r1) in zip(rows, rows[1:], strict=False):
        print(f"  {s1 / s0:.2f}x lines: wall {w1 / w0:.2f}x, CPU {c1 / c0:.2f}x, peak RSS {r1 / r0:.2f}x")


if __name__ == "__main__":
    main()
