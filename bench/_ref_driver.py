"""Runs the published reference implementation's reflect stage; executed by ITS venv's python.

    <ref venv>/bin/python bench/_ref_driver.py --data DIR --patches DIR --result FILE [--workers 16 ...]

It imports only the installed `skillopt` package (nothing of reflact) and calls
skillopt.gradient.reflect.run_minibatch_reflect once, with our analyst templates passed as
error_system / success_system (its wheel ships no prompt files). Its OpenAI chat backend is
pointed at the loopback server by the environment the caller sets, read by
skillopt/model/azure_openai.py at import:

    OPTIMIZER_BACKEND=openai_chat              (skillopt/model/backend_config.py)
    AZURE_OPENAI_AUTH_MODE=openai_compatible   -> openai.OpenAI(base_url=endpoint, api_key=key)
    AZURE_OPENAI_ENDPOINT=<base_url>           (e.g. http://127.0.0.1:PORT/v1)
    AZURE_OPENAI_API_KEY=dummy
    OPTIMIZER_DEPLOYMENT=<model name>

Results are passed in the order reflact uses (sorted by id), so that with the same seed both
shuffle the same list the same way and form the same minibatches. The wall time of the call is
written as JSON to --result; the package's own progress lines go to stdout. With --cells M,L,SEED
..., it calls run_minibatch_reflect once per cell, one after another in this one process, each
into its own folder under --patches (a bare loop over a sweep's cells; --result: the total).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--patches", type=Path, required=True)
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--error-template", type=Path, required=True)
    parser.add_argument("--success-template", type=Path, required=True)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("-M", "--minibatch-size", type=int, default=8)
    parser.add_argument("-L", "--edit-budget", type=int, default=4)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--cells", nargs="+", help="M,L,SEED ...: a loop over these cells instead")
    args = parser.parse_args()

    started_process = time.perf_counter()
    import skillopt.gradient.reflect as reflect
    from skillopt.model import azure_openai, backend_config

    assert backend_config.get_optimizer_backend() == "openai_chat", backend_config.get_optimizer_backend()
    assert azure_openai.OPTIMIZER_AUTH_MODE == "openai_compatible", azure_openai.OPTIMIZER_AUTH_MODE
    assert azure_openai.OPTIMIZER_ENDPOINT == os.environ["AZURE_OPENAI_ENDPOINT"]
    imported = time.perf_counter()

    results = [json.loads(line) for line in (args.data / "results.jsonl").read_text(encoding="utf-8").splitlines()
               if line.strip()]
    results.sort(key=lambda r: str(r["id"]))
    minibatches = record_minibatches(reflect)
    skill = (args.data / "skill.md").read_text(encoding="utf-8")
    cells = [(args.minibatch_size, args.edit_budget, args.seed, args.patches)]
    if args.cells:
        cells = [(*(int(x) for x in text.split(",")), args.patches / text.replace(",", "_"))
                 for text in args.cells]
    started = time.perf_counter()
    patches = []
    for m, l_, seed, folder in cells:
        patches += reflect.run_minibatch_reflect(
            results, skill, str(args.data / "predictions"), str(folder), args.workers, False,
            minibatch_size=m, edit_budget=l_, random_seed=seed,
            error_system=args.error_template.read_text(encoding="utf-8"),
            success_system=args.success_template.read_text(encoding="utf-8"),
        )
    wall = time.perf_counter() - started
    args.result.write_text(json.dumps({
        "wall_s": wall,
        "import_s": imported - started_process,
        "patches": sum(1 for p in patches if p),
        "results": len(results),
        "minibatches": minibatches,
    }))


def record_minibatches(reflect) -> list:
    """Wrap its two analyst functions (looked up by name at call time) to record which ids each
    minibatch holds, so the caller can check that both implementations formed the same ones."""
    seen: list = []
    for group, name in (("failure", "run_error_analyst_minibatch"), ("success", "run_success_analyst_minibatch")):
        analyst = getattr(reflect, name)

        def wrapper(skill, items, *args, _analyst=analyst, _group=group, **kwargs):
            seen.append([_group, [str(item["id"]) for item in items]])
            return _analyst(skill, items, *args, **kwargs)

        setattr(reflect, name, wrapper)
    return seen


if __name__ == "__main__":
    main()
