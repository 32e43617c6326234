"""Do two versions of reflact write the same prompts, patches and summaries? For refactors.

    python bench/same_outputs.py BASE_REV [--data DIR]

Exports BASE_REV with `git archive`, then runs it and the working tree on the demo dataset and
on the real one (default: the shared hotpotqa set), in several modes, against the loopback test
optimizer (deterministic replies), MLflow and the cache off. Every file of each run dir is
compared; timings (latency, start times, wall time) are the only fields left out. Prints one
line per run and the differing files; exits 1 when anything differs.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import BASE_ENV, DEFAULT_DATA, REPO, check_data, rmtree  # noqa: E402
from reflact.testing.optimizer_server import OptimizerServer  # noqa: E402

VARIANTS = {
    "patch": [],
    "rewrite": ["reflect.update_mode=rewrite"],
    "full_rewrite": ["reflect.update_mode=full_rewrite"],
    "skill_aware": ["reflect.skill_aware.enabled=true", "reflect.minibatch_size=4", "reflect.edit_budget=-1"],
    "split": ["optimizer.context_window=5000", "optimizer.max_output_tokens=2000"],
    "shorten": ["optimizer.context_window=3500", "optimizer.max_output_tokens=2000",
                "optimizer.context_overflow=shorten"],
    "dry_run": ["optimizer.dry_run=true"],
}
TIMING_KEYS = {"latency_s", "started_at", "ended_at", "wall_time_s"}
IGNORED = {"run.log", "mlflow_run.json", ".lock"}  # .lock holds the process id
# files a newer version adds to every run dir, beside the unchanged ones: compared when both have them,
# reported (not counted as a difference) when only the head has them
ADDED = {"analysis.json"}


def export(rev: str, into: Path) -> Path:
    archive = into / "base.tar"
    subprocess.run(["git", "-C", str(REPO), "archive", "-o", str(archive), rev], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / "base", filter="data")
    return into / "base"


def run(tree: Path, data: Path, overrides: list[str], run_dir: Path, url: str, launch: Path) -> int:
    env = {**BASE_ENV, "PYTHONPATH": str(tree)}
    args = [sys.executable, "-m", "reflact.run", f"data.dir={data}", "optimizer=compatible",
            f"optimizer.base_url={url}", "optimizer.model=test", "optimizer.cache=off", "mlflow.enabled=false",
            f"hydra.run.dir={run_dir}", *overrides]
    done = subprocess.run(args, cwd=launch, env=env, capture_output=True, text=True)
    if done.returncode:
        print(done.stderr[-2000:], file=sys.stderr)
    return done.returncode


def comparable(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".json", ".jsonl"):
        rows = [json.loads(text)] if path.suffix == ".json" else [json.loads(x) for x in text.split("\n") if x.strip()]
        return [json.dumps(_drop_timing(row), sort_keys=True, indent=1) for row in rows]
    return [line for line in text.splitlines() if "wall_time_s" not in line]


def _drop_timing(obj: object) -> object:
    if isinstance(obj, dict):
        return {k: _drop_timing(v) for k, v in obj.items() if k not in TIMING_KEYS}
    if isinstance(obj, list):
        return [_drop_timing(v) for v in obj]
    return obj


def differences(a: Path, b: Path) -> list[str]:
    files = ({p.relative_to(a) for p in a.rglob("*") if p.is_file()}
             | {p.relative_to(b) for p in b.rglob("*") if p.is_file()})
    out = []
    for rel in sorted(files):
        if rel.name in IGNORED or rel.parts[0] == ".hydra":
            continue
        if rel.name in ADDED and (b / rel).is_file() and not (a / rel).is_file():
            continue  # new in the head: not a change to what the base writes
        if not (a / rel).is_file() or not (b / rel).is_file():
            out.append(f"{rel}: only in {'head' if (b / rel).is_file() else 'base'}")
            continue
        left, right = comparable(a / rel), comparable(b / rel)
        if left != right:
            diff = list(difflib.unified_diff(left, right, "base", "head", lineterm="", n=1))[:12]
            out.append(f"{rel}:\n  " + "\n  ".join(diff))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="the git revision to compare the working tree with")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = parser.parse_args()
    datasets = {"demo": REPO / "examples" / "demo", "real": check_data(args.data)}
    work = Path(tempfile.mkdtemp(prefix="reflact-same-"))
    failed = 0
    try:
        base = export(args.base, work)
        (work / "launch").mkdir()
        with OptimizerServer() as server:
            for ds, data in datasets.items():
                for variant, overrides in VARIANTS.items():
                    dirs = {label: work / label / ds / variant for label in ("base", "head")}
                    codes = [run(tree, data, overrides, dirs[label], server.base_url, work / "launch")
                             for label, tree in (("base", base), ("head", REPO))]
                    diff = differences(dirs["base"], dirs["head"]) if codes == [0, 0] else [f"exit codes {codes}"]
                    files = sum(1 for p in dirs["head"].rglob("*") if p.is_file())
                    print(f"{ds:5} {variant:12} {files:4} files: {'same' if not diff else 'DIFFERENT'}")
                    for line in diff:
                        print("   ", line)
                    failed += bool(diff)
    finally:
        rmtree(work)
    print("all the same" if not failed else f"{failed} run(s) differ")
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    sys.exit(main())
