"""How many single-line changes to SPEC's rules the fast tests catch: mutation testing with mutmut 3.

mutmut ([tool.mutmut] in pyproject.toml names the modules and the fast tests) makes about 2,500
mutants of the modules that hold SPEC's rules; running all of them takes well over an hour on two
shared cores. This runs a seeded sample of each module's mutants instead, the same sample every
time, and prints per module the share killed and the mutants that survived.

    pip install mutmut==3.8.1
    python bench/mutants.py                 # a 10 % sample, seed 12
    python bench/mutants.py --share 1       # every mutant (long)
    python bench/mutants.py --rerun-survivors   # after adding tests: rerun the sample's survivors
    python bench/mutants.py --report        # only print the figures of the last run
    python bench/mutants.py --share 0.03 --modules relog,sweeps.jobs   # some modules only

Run it from the repository root. mutmut copies the tree into mutants/ and mutates that copy: the
checkout itself is never modified (delete mutants/ to start afresh). A result mutmut already holds
for a mutant of the sample is kept unless --rerun-survivors asks again (tests only ever get added,
so a killed mutant stays killed).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

from mutmut.stats import status_by_exit_code

META = Path("mutants") / "reflact"
COUNTED = ("killed", "timeout", "survived")  # a mutant the tests ran against


def results() -> dict[str, dict[str, int | None]]:
    """module (dotted under reflact, e.g. `prompting.plan`) -> {mutant name: mutmut's exit code, None
    when not run yet}. The modules sit in subpackages: their records too."""
    return {".".join(path.relative_to(META).with_suffix("").with_suffix("").parts):
            json.loads(path.read_text())["exit_code_by_key"]
            for path in sorted(META.rglob("*.py.meta"))}


def sample(by_module: dict[str, dict], share: float, seed: int) -> dict[str, list[str]]:
    """The same share of each module's mutants: the first of them in an order seeded per module, so
    a smaller share's sample is part of a larger one's."""
    picked = {}
    for module, codes in by_module.items():
        names = sorted(codes)
        random.Random(f"{seed}:{module}").shuffle(names)
        picked[module] = sorted(names[:max(1, round(share * len(names)))]) if names else []
    return picked


def mutmut_run(names: list[str]) -> None:
    if names:
        subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", "1", *names], check=False)


def ensure_generated() -> None:
    """mutmut makes its mutants (and test statistics) on its first run; one mutant is enough for that."""
    if not any(META.glob("*.py.meta")):
        mutmut_run(["reflact.prompting.plan.x_chunks__mutmut_1"])


def report(picked: dict[str, list[str]]) -> None:
    by_module = results()
    total = Counter()
    survivors = []
    print(f"{'module':<22} {'sampled':>7} {'killed':>6} {'timeout':>7} {'survived':>8} {'no tests':>8} "
          f"{'not run':>7} {'killed %':>8}")
    for module, names in picked.items():
        status = Counter(status_by_exit_code[by_module[module].get(name)] for name in names)
        ran = sum(status[s] for s in COUNTED)
        share = f"{100 * (status['killed'] + status['timeout']) / ran:.1f}" if ran else "-"
        print(f"{module:<22} {len(names):>7} {status['killed']:>6} {status['timeout']:>7} {status['survived']:>8} "
              f"{status['no tests']:>8} {status['not checked']:>7} {share:>8}")
        total.update(status)
        survivors += [name for name in names if status_by_exit_code[by_module[module].get(name)] == "survived"]
    ran = sum(total[s] for s in COUNTED)
    print(f"{'all':<22} {sum(map(len, picked.values())):>7} {total['killed']:>6} {total['timeout']:>7} "
          f"{total['survived']:>8} {total['no tests']:>8} {total['not checked']:>7} "
          f"{100 * (total['killed'] + total['timeout']) / max(ran, 1):>8.1f}")
    print("\nsurvivors (mutmut show <name> prints the change):")
    print("\n".join(survivors))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--share", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--rerun-survivors", action="store_true")
    parser.add_argument("--report", action="store_true")
    parser.add_argument("--modules", help="only these modules, comma-separated (e.g. relog,sweeps.jobs)")
    args = parser.parse_args()
    ensure_generated()
    picked = sample(results(), args.share, args.seed)
    if args.modules:
        wanted = set(args.modules.split(","))
        picked = {module: names for module, names in picked.items() if module in wanted}
    if not args.report:
        by_module = results()
        # "no tests" too: mutmut decides it at once, and an interrupted run can leave it wrongly
        wanted = ("survived",) if args.rerun_survivors else ("not checked", "check was interrupted by user", "no tests")
        mutmut_run([n for m, names in picked.items() for n in names if status_by_exit_code[by_module[m][n]] in wanted])
    report(picked)


if __name__ == "__main__":
    main()
