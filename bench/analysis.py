"""How long the analysis of a run takes: agreement, redundancy and distinct items of 10,000 kept
edits, and the seed agreement of two such runs.

    python bench/analysis.py [--edits N] [--repeat R] [--threshold T]

Writes synthetic run dirs (summary.json and kept_items.jsonl, as a run leaves them) into a temp
dir: minibatches of 4 kept edits and 2 draws each, half failures, half successes. The edits are
rules made of 6 to 30 words from a vocabulary of 3,000, by op (append 50 %, insert_after 25 %,
replace 15 %, delete 10 %, targets from a 40-line skill): 40 % are drawn from a pool of 2,000
rules (so some recur in other minibatches and draws), half of those reworded by one word, the
rest are new; the second draw of a minibatch repeats 60 % of the first one's edits. Then, each
the median of --repeat: `analyse_run_dir` (read, match, write analysis.json) of one run;
`seed_agreement` over two runs with other seeds; and a worst case, N templated edits that all
match one another (the pairs are used chunk by chunk, never held). Prints seconds, the run's
figures and the process's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import rmtree, scratch  # noqa: E402
from reflact.analysis.figures import analyse_run_dir, load_run, seed_agreement  # noqa: E402
from reflact.analysis.matching import item_key, match  # noqa: E402
from reflact.prompting.plan import Minibatch  # noqa: E402
from reflact.running.rundir import RunDir  # noqa: E402

OPS = (("append", 0.5), ("insert_after", 0.25), ("replace", 0.15), ("delete", 0.10))


def vocabulary(rng: random.Random) -> tuple[list[str], list[str], list[str]]:
    """(words, a pool of recurring rules, skill lines to target)."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 10))) for _ in range(3000)]
    rule = lambda: "- " + " ".join(rng.choice(words) for _ in range(rng.randint(6, 30))) + "."  # noqa: E731
    return words, [rule() for _ in range(2000)], [rule() for _ in range(40)]


def edit(rng: random.Random, words: list[str], pool: list[str], skill: list[str]) -> dict:
    if rng.random() < 0.4:
        text = rng.choice(pool)
        if rng.random() < 0.5:  # reworded: one word changed
            parts = text.split()
            parts[rng.randrange(1, len(parts))] = rng.choice(words)
            text = " ".join(parts)
    else:
        text = "- " + " ".join(rng.choice(words) for _ in range(rng.randint(6, 30))) + "."
    op = rng.choices([o for o, _ in OPS], [w for _, w in OPS])[0]
    if op == "append":
        return {"op": op, "content": text}
    if op == "delete":
        return {"op": op, "target": rng.choice(skill)}
    return {"op": op, "target": rng.choice(skill), "content": text}


def write_run(root: Path, edits: int, seed: int) -> Path:
    """A run dir of `edits` kept edits: minibatches of 4 edits a draw, 2 draws each."""
    rng = random.Random(seed)
    words, pool, skill = vocabulary(random.Random(0))  # the same vocabulary in every run
    rd = RunDir(root)
    root.mkdir(parents=True, exist_ok=True)
    records = []
    with rd.kept_items_writer() as kept:
        for n in range(edits // 8):
            group, index = ("failure", n // 2) if n % 2 == 0 else ("success", n // 2)
            first = [edit(rng, words, pool, skill) for _ in range(4)]
            for draw in range(2):
                tag = Minibatch(group, index, [], draw).tag
                records.append({"tag": tag, "group": group, "index": index, "status": "done"})
                for position in range(4):  # the second draw repeats 60 % of the first one's edits
                    item = first[position] if draw == 0 or rng.random() < 0.6 else edit(rng, words, pool, skill)
                    row = {"minibatch": tag, "position": position, "trajectory_ids": [], "item": item}
                    kept.write(json.dumps(row) + "\n")
    rd.write_summary({"settings": {"update_mode": "patch", "minibatch_size": 8, "edit_budget": 4, "seed": seed,
                                   "samples": 2}, "counts": {"cost_usd": 12.5}, "minibatches": records})
    return root


def timed(repeat: int, fn) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edits", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threshold", type=float, default=0.85)
    args = parser.parse_args()
    work = scratch("analysis")
    try:
        one, two = write_run(work / "seed1", args.edits, 1), write_run(work / "seed2", args.edits, 2)
        seconds, figures = timed(args.repeat, lambda: analyse_run_dir(RunDir(one), args.threshold))
        print(f"one run, {figures['edits']:,} kept edits: {seconds:.2f} s (read, match, write analysis.json)")
        print(f"  distinct {figures['distinct_edits']:,}, redundancy {figures['redundancy']:.3f}, "
              f"agreement {figures['agreement']:.3f}, {len(figures['near_duplicates']):,} groups of near-duplicates")
        runs = [load_run(one), load_run(two)]
        seconds, cells = timed(args.repeat, lambda: seed_agreement(runs, args.threshold))
        print(f"seed agreement over two runs ({2 * args.edits:,} edits): {seconds:.2f} s, "
              f"{cells[0]['seed_agreement']:.3f}")
        keys = [item_key({"op": "append", "content": f"- rule {i % 3} from run_{i:05d}"}) for i in range(args.edits)]
        seconds, matched = timed(args.repeat, lambda: match(keys, 0.8, {"any": ([0] * args.edits,
                                                                               list(range(args.edits)))}))
        print(f"worst case, {args.edits:,} templated edits that all match: {seconds:.2f} s, "
              f"{matched.distinct()} cluster")
        print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    finally:
        rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
