"""How long the end-of-run analysis takes on a few very large kept items (a reply whose edits are
megabytes long), and how soon SIGTERM ends it.

    python bench/big_items.py [--items 16] [--mb 1.0] [--timeout 600]

Writes one synthetic run dir (summary.json and kept_items.jsonl, as a run leaves them) into a temp
dir: --items kept `append` edits of --mb megabytes of random words each, half in failure and half
in success minibatches, then times `analyse_run_dir` with the lexical matcher at its default
threshold and the default analysis.max_items, as the end of a run calls it. --timeout stops the
measurement (SIGALRM) and prints "> T s" instead. Then the same analysis in a child process that
gets SIGTERM after 1 s: the seconds from the signal to the child's exit.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import rmtree, scratch  # noqa: E402
from reflact.analysis.figures import analyse_run_dir  # noqa: E402
from reflact.config import AnalysisConfig  # noqa: E402
from reflact.running.rundir import RunDir  # noqa: E402


def write_run(root: Path, items: int, mb: float, seed: int = 0) -> RunDir:
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 9))) for _ in range(5000)]
    root.mkdir(parents=True)
    tags = [f"minibatch_{'fail' if n % 2 == 0 else 'succ'}_{n // 2:03d}" for n in range(items)]
    size = int(mb * 1024 * 1024)
    with open(root / "kept_items.jsonl", "w", encoding="utf-8") as out:
        for tag in tags:
            text, length = [], 0
            while length < size:
                word = rng.choice(words)
                text.append(word)
                length += len(word) + 1
            item = {"op": "append", "content": " ".join(text)}
            out.write(json.dumps({"minibatch": tag, "position": 0, "trajectory_ids": [], "item": item}) + "\n")
    records = [{"tag": tag, "group": tag.split("_")[1], "index": int(tag[-3:]), "status": "done"} for tag in tags]
    for record in records:
        record["group"] = "failure" if record["group"] == "fail" else "success"
    summary = {"settings": {"seed": 42, "update_mode": "patch"}, "counts": {"cost_usd": None}, "minibatches": records}
    (root / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    return RunDir(root)


def timed(rd: RunDir, timeout: float) -> str:
    def give_up(signum, frame):
        raise TimeoutError

    signal.signal(signal.SIGALRM, give_up)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    start = time.perf_counter()
    try:
        figures = analyse_run_dir(rd, AnalysisConfig().match_threshold, AnalysisConfig().max_items)
    except TimeoutError:
        return f"> {timeout:.0f} s (stopped)"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    seconds = time.perf_counter() - start
    what = figures.get("skipped") or f"{figures['distinct_edits']} distinct"
    return f"{seconds:.2f} s ({what})"


def sigterm_delay(rd: RunDir, timeout: float) -> str:
    """A child runs the analysis with reflact's SIGTERM handling; the seconds from SIGTERM to its exit."""
    code = (
        "import sys; from reflact.core.errors import raise_stopped_on_sigterm; raise_stopped_on_sigterm();"
        "from reflact.analysis.figures import analyse_run_dir; from reflact.running.rundir import RunDir;"
        "import reflact.analysis.matching as m; m.warm_imports(); print('ready', flush=True);"
        "analyse_run_dir(RunDir(sys.argv[1]), 0.85, 20000)"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(rd.root)],
        stdout=subprocess.PIPE,
        text=True,
        stderr=subprocess.DEVNULL,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert child.stdout is not None
    child.stdout.readline()
    time.sleep(1.0)
    sent = time.perf_counter()
    child.send_signal(signal.SIGTERM)
    try:
        child.wait(timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        return f"> {timeout:.0f} s (killed)"
    return f"{time.perf_counter() - sent:.2f} s (exit code {child.returncode})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=16)
    parser.add_argument("--mb", type=float, default=1.0)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    root = scratch("big_items")
    try:
        rd = write_run(root / "run", args.items, args.mb)
        print(f"analysis of {args.items} kept items of {args.mb} MB: {timed(rd, args.timeout)}")
        print(f"SIGTERM 1 s into it, to the exit: {sigterm_delay(rd, args.timeout)}")
    finally:
        rmtree(root)


if __name__ == "__main__":
    main()
