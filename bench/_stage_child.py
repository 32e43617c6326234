"""The reflect stage alone, in a fresh process: `reflact.running.stage.Stage.run()` timed, JSON to --result.

    python bench/_stage_child.py --data DIR --base-url URL --run-dir DIR --result FILE [--workers 16 ...]

The config is composed as `python -m reflact.run` would compose it, the dataset loaded and the
client built (the OpenAI SDK imported) before the clock starts; what is timed is Stage.run():
planning, rendering, the calls, the patch and call files. No Hydra job, preview, summary or MLflow.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("-M", "--minibatch-size", type=int, default=8)
    parser.add_argument("-L", "--edit-budget", type=int, default=4)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    from _common import compose_config

    from reflact.core.modes import get_mode
    from reflact.inputs.dataset import load_dataset
    from reflact.orchestration.experiment import make_optimizer
    from reflact.running.stage import Stage, StageSettings

    cfg = compose_config(
        f"data.dir={args.data}", "optimizer=compatible", f"optimizer.base_url={args.base_url}",
        "optimizer.model=bench-model", "optimizer.cache=off", "mlflow.enabled=false",
        f"reflect.workers={args.workers}", f"reflect.minibatch_size={args.minibatch_size}",
        f"reflect.edit_budget={args.edit_budget}", f"reflect.seed={args.seed}",
    )
    dataset = load_dataset(cfg.data)
    optimizer = make_optimizer(cfg.optimizer, get_mode(cfg.reflect.update_mode), args.run_dir, dataset.skill)
    stage = Stage(StageSettings(cfg.reflect, cfg.prompts, cfg.optimizer), dataset, optimizer, args.run_dir)
    started_at = time.time()
    started = time.perf_counter()
    outcomes = stage.run()
    wall = time.perf_counter() - started
    args.result.write_text(json.dumps({
        "wall_s": wall,
        "started_at": started_at,
        "calls": sum(o.calls for o in outcomes),
        "minibatches": len(outcomes),
        "failed": sum(o.status == "failed" for o in outcomes),
    }))


if __name__ == "__main__":
    main()
