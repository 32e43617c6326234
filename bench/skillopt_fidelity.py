"""SkillOpt's own trainer with and without reflact: every file it writes, compared byte for byte.

    python bench/skillopt_fidelity.py [--modes patch,...] [--workers 16,1] [--keep DIR]

Runs against the SkillOpt installed beside reflact (0.2.0 is the one checked): its `ReflACTTrainer`, two
steps on the tests' replay environment (tests/skillopt_replay.py), the stand-in optimizer on 127.0.0.1
named only in SkillOpt's own settings, each run its own process (tests/skillopt_fidelity.py), once with
SkillOpt's reflect and once after `reflact.compat.skillopt.install()`, in every update mode, with
skill-aware reflection on and off, at SkillOpt's default analyst workers (16, M=8) and at one (M=3).
Prints per set-up the files compared, those identical byte for byte, those identical once their timing
values are blanked (history.json, step_record.json, summary.json: the clock, nothing else), and any that
differ, with where. With more than one worker SkillOpt keeps its patches in the order its calls end:
its run is repeated until they ended in the order it made them (`SkillOpt runs`), the run reflact's
deterministic order reproduces. Exit code 1 when any file differs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reflact.testing.optimizer_server import OptimizerServer  # noqa: E402
from tests import skillopt_fidelity as fidelity  # noqa: E402
from tests import skillopt_replay as replay  # noqa: E402

SETS = {16: {"minibatch_size": 8, "seed": 4}, 1: {"minibatch_size": 3, "seed": 7}}  # as the test runs them


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--modes", default=",".join(fidelity.MODES))
    parser.add_argument("--workers", default="16,1", help="analyst workers, comma-separated (16 and/or 1)")
    parser.add_argument("--keep", type=Path, help="leave the runs in this folder (default: a temp folder, removed)")
    args = parser.parse_args()
    try:
        installed = version("skillopt")
    except PackageNotFoundError:
        print("skillopt_fidelity: SkillOpt is not installed in this Python (pip install skillopt==0.2.0)")
        return 2
    setups = [
        fidelity.Setup(mode, aware, int(w), **SETS.get(int(w), SETS[16]))
        for mode in args.modes.split(",")
        for aware in (True, False)
        for w in args.workers.split(",")
    ]
    print(f"skillopt {installed}, python {sys.version.split()[0]}\n")
    print("| set-up | files compared | identical bytes | identical but timings | differ | SkillOpt runs | s |")
    print("|---|---|---|---|---|---|---|")
    differ = 0
    with tempfile.TemporaryDirectory(prefix="skillopt-fidelity-") as tmp, OptimizerServer(script=replay.answer) as srv:
        root = args.keep or Path(tmp)
        for n, setup in enumerate(setups):
            started = time.monotonic()
            pair = fidelity.train_both(root / f"{n:02d}", srv.base_url, setup)
            compared = fidelity.compare(pair.theirs, pair.ours)
            bad = [c for c in compared if not c.identical]
            differ += len(bad)
            same, timed = sum(c.identical and not c.why for c in compared), sum(c.why == "timings" for c in compared)
            print(
                f"| {setup} | {len(compared)} | {same} | {timed} | {len(bad)} | {pair.attempts} | "
                f"{time.monotonic() - started:.0f} |",
                flush=True,
            )
            for c in bad:
                print(f"|   {c.name}: {c.why} | | | | | | |")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
