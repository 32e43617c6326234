"""The peer: the script a careful user writes around the reference's reflect to log it to MLflow.

    python bench/peer.py --data DIR --out DIR --error-template FILE --success-template FILE \\
        [--cells 8,4,42 2,1,1 ...] [--workers 16] [--mode patch] [--experiment peer] \\
        [--tracking-uri sqlite:///outputs/mlflow.db] [--result FILE]

One process, nothing of reflact imported: mlflow and skillopt 0.2.0 (the project venv has both).
`mlflow.openai.autolog()` makes every optimizer call a trace; `mlflow.set_experiment` once; then
per cell (M, L, seed) one `mlflow.start_run()` with the params M, L, mode and seed, skillopt's
`run_minibatch_reflect` over the dataset with the given workers (results sorted by id, as
bench/_ref_driver.py passes them, so both form reflact's minibatches), the edit counts in one
`log_metrics` call (one batch write) and the cell's patches folder with `log_artifacts`.

The optimizer is reached as the reference's driver reaches it: skillopt's OpenAI chat backend,
configured by the environment its caller sets (see bench/_ref_driver.py). Nothing is made slow
on purpose: MLflow's defaults as a user has them (its trace export, its exit handlers).
With --result, per-cell wall times go there as JSON (the bench reads them; a user would not).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

started = time.perf_counter()

import mlflow  # noqa: E402
import skillopt.gradient.reflect as reflect  # noqa: E402
from skillopt.optimizer.update_modes import get_payload_items  # noqa: E402

imported = time.perf_counter()


def cell(text: str) -> tuple[int, int, int]:
    """`M,L,SEED` -> (M, L, seed)."""
    m, l_, seed = (int(part) for part in text.split(","))
    return m, l_, seed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True, help="a patches folder per cell goes under it")
    parser.add_argument("--error-template", type=Path, required=True)
    parser.add_argument("--success-template", type=Path, required=True)
    parser.add_argument("--cells", type=cell, nargs="+", default=[(8, 4, 42)], help="M,L,SEED ...")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--mode", default="patch")
    parser.add_argument("--experiment", default="peer")
    parser.add_argument("--tracking-uri", default="sqlite:///outputs/mlflow.db")
    parser.add_argument("--result", type=Path)
    args = parser.parse_args()

    mlflow.set_tracking_uri(args.tracking_uri)
    mlflow.openai.autolog()
    mlflow.set_experiment(args.experiment)
    results = [json.loads(line) for line in (args.data / "results.jsonl").read_text(encoding="utf-8").splitlines()
               if line.strip()]
    results.sort(key=lambda r: str(r["id"]))
    skill = (args.data / "skill.md").read_text(encoding="utf-8")
    error_system = args.error_template.read_text(encoding="utf-8")
    success_system = args.success_template.read_text(encoding="utf-8")

    cells = []
    for m, l_, seed in args.cells:
        began = time.perf_counter()
        patches_dir = args.out / f"M{m}_L{l_}_seed{seed}"
        with mlflow.start_run(run_name=patches_dir.name):
            mlflow.log_params({"M": m, "L": l_, "mode": args.mode, "seed": seed})
            patches = reflect.run_minibatch_reflect(
                results, skill, str(args.data / "predictions"), str(patches_dir), args.workers, False,
                minibatch_size=m, edit_budget=l_, random_seed=seed, update_mode=args.mode,
                error_system=error_system, success_system=success_system,
            )
            kept = [p for p in patches if p]
            edits = [len(get_payload_items(p.get("patch") or {}, args.mode)) for p in kept]
            mlflow.log_metrics({
                "patches": len(kept),
                "failure_patches": sum(p.get("source_type") == "failure" for p in kept),
                "success_patches": sum(p.get("source_type") == "success" for p in kept),
                "edits": sum(edits),
            })
            mlflow.log_artifacts(str(patches_dir), "patches")
        cells.append({"cell": [m, l_, seed], "wall_s": time.perf_counter() - began, "patches": len(kept)})

    if args.result:
        args.result.write_text(json.dumps({"import_s": imported - started, "cells": cells,
                                           "main_s": time.perf_counter() - started}))


if __name__ == "__main__":
    main()
