"""reflact side by side with the published reference implementation (skillopt 0.2.0 on PyPI).

    python bench/reference.py [--latency 0.5] [--workers 16] [--runs 2000] [--data DIR] [--repeat 1]
                              [--ref-venv DIR]

The reference runs in its own venv (default bench/.venv-ref, git-ignored), created on first use
with `pip install skillopt==0.2.0`. bench/_ref_driver.py, run by that venv's python, calls its
skillopt.gradient.reflect.run_minibatch_reflect with our analyst templates (prompts/
analyst_error.md, analyst_success.md; its wheel ships none) and its OpenAI chat backend pointed
at the loopback server through environment variables (see _ref_driver.py). Nothing of the
reference is copied into this repository.

Both run on the same data with the same server (latency), M, L, seed and workers, each in a
fresh process. Reported per dataset and implementation:
  stage      the reflect stage alone: reflact's Stage.run() / the reference's run_minibatch_reflect()
             (both after their imports; reflact also writes call records, the reference only patches)
  process    the whole process: `python -m reflact.run ...` / the reference's driver script
  requests   chat requests the server received
  chars/call characters of the messages of each request (measured by the server), mean
With --repeat N each is measured N times and the median is reported (with the range).
Target: reflact's stage wall time <= the reference's (ratio reflact/reference <= 1).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    BASE_ENV,
    BENCH,
    REPO,
    Server,
    chars_per_call,
    median_text,
    run_process,
    run_reflact,
    run_stage,
    side_by_side_inputs,
    stage_arguments,
)

REF_VERSION = "0.2.0"


def ref_version(python: Path) -> str | None:
    if not python.exists():
        return None
    proc = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('skillopt'))"],
                          capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else None


def ensure_ref_venv(venv: Path) -> Path:
    """The reference's venv with skillopt==REF_VERSION; created (about a minute) when missing."""
    python = venv / "bin" / "python"
    if ref_version(python) == REF_VERSION:
        return python
    print(f"creating {venv} with skillopt=={REF_VERSION} ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if subprocess.run(pip + [f"skillopt=={REF_VERSION}"]).returncode != 0:
        sys.exit(f"could not install skillopt=={REF_VERSION} into {venv}")
    if ref_version(python) != REF_VERSION:
        sys.exit(f"skillopt {REF_VERSION} is not importable from {python}")
    return python


def run_reference(python: Path, data: Path, server: Server, work: Path, name: str, args) -> dict:
    patches = work / "ref" / name / "patches"
    patches.parent.mkdir(parents=True, exist_ok=True)
    result = work / "ref" / name / "result.json"
    env = {
        **BASE_ENV,
        "OPTIMIZER_BACKEND": "openai_chat",
        "AZURE_OPENAI_AUTH_MODE": "openai_compatible",
        "AZURE_OPENAI_ENDPOINT": server.base_url,
        "AZURE_OPENAI_API_KEY": "dummy",
        "OPTIMIZER_DEPLOYMENT": "bench-model",
    }
    server.reset()
    proc = run_process(
        [str(python), str(BENCH / "_ref_driver.py"), "--data", str(data), "--patches", str(patches),
         "--result", str(result), "--error-template", str(REPO / "prompts" / "analyst_error.md"),
         "--success-template", str(REPO / "prompts" / "analyst_success.md"), "--workers", str(args.workers),
         "-M", str(args.minibatch_size), "-L", str(args.edit_budget), "--seed", str(args.seed)],
        cwd=work, env=env,
    )
    if proc.returncode != 0 or not result.is_file():
        sys.exit(f"the reference run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return {**json.loads(result.read_text()), "proc": proc, "server": server.stats()}


def same_minibatches(summary: dict, reference: list) -> str:
    ours = {(mb["group"], tuple(mb["ids"])) for mb in summary["minibatches"]}
    theirs = {(group, tuple(ids)) for group, ids in reference}
    if ours == theirs:
        return f"yes ({len(ours)})"
    return f"NO: {len(ours - theirs)} only in reflact, {len(theirs - ours)} only in the reference"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    stage_arguments(parser)
    parser.add_argument("--ref-venv", type=Path, default=BENCH / ".venv-ref")
    parser.add_argument("--repeat", type=int, default=1, help="measurements per figure; the median is reported")
    args = parser.parse_args()
    python = ensure_ref_venv(args.ref_venv.resolve())
    with side_by_side_inputs(args, "reference") as (datasets, work, settings):
        print(f"reference: skillopt {REF_VERSION}")
        rows = []
        with Server(args.latency) as server:
            for name, path in datasets:
                runs = {"reflact": [], "reference": []}
                for i in range(args.repeat):
                    stage = run_stage(path, server, work / "stage" / f"{name}_{i}", **settings)
                    cli = run_reflact(path, server, work, f"{name}_{i}", **settings)
                    if cli["server"]["requests"] != stage["server"]["requests"]:
                        print(f"  note: the reflact CLI run made {cli['server']['requests']} requests")
                    runs["reflact"].append((stage["wall_s"], cli["proc"], stage["server"]))
                    ref = run_reference(python, path, server, work, f"{name}_{i}", args)
                    if i == 0:
                        same = same_minibatches(cli["summary"], ref["minibatches"])
                        print(f"  {name}: the same minibatches (group and ids) in both: {same}")
                    runs["reference"].append((ref["wall_s"], ref["proc"], ref["server"]))
                rows.append((name, runs))
                print(f"\n{name}:")
                print(f"  {'':10s} {'requests':>8} {'chars/call':>10}  {'stage':28s} {'process':28s} {'peak RSS':>8}")
                for label, measured in runs.items():
                    stats = measured[-1][2]
                    print(f"  {label:10s} {stats['requests']:8d} {chars_per_call(stats):10.0f}  "
                          f"{median_text([m[0] for m in measured]):28s} "
                          f"{median_text([m[1].wall_s for m in measured]):28s} "
                          f"{statistics.median(m[1].max_rss_mb for m in measured):6.0f}MB")
        print("\nratios reflact / reference, medians (target for the stage <= 1):")
        for name, runs in rows:
            ours, ref = runs["reflact"], runs["reference"]
            stage = statistics.median(m[0] for m in ours) / statistics.median(m[0] for m in ref)
            process = statistics.median(m[1].wall_s for m in ours) / statistics.median(m[1].wall_s for m in ref)
            chars = chars_per_call(ours[-1][2]) / chars_per_call(ref[-1][2])
            print(f"  {name:26s} stage {stage:.3f} ({'ok' if stage <= 1 else 'ABOVE TARGET'})  process {process:.3f}  "
                  f"chars/call {chars:.3f}  requests {ours[-1][2]['requests']}/{ref[-1][2]['requests']}")


if __name__ == "__main__":
    main()
