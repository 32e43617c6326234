"""Log a finished run dir into MLflow again, e.g. after the tracking store was unreachable:

    python -m reflact.relog RUN_DIR [--tracking-uri URI]

Run it from the directory the run was started from (the default store is outputs/mlflow.db
there). Nothing is called and nothing in the run dir changes but its record of the MLflow run.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from reflact.errors import UserError
from reflact.files import read_json


def relog(run_dir: Path, launch_dir: Path, tracking_uri: str | None) -> str | None:
    from omegaconf import OmegaConf

    from reflact import config
    from reflact.tracking import log_run

    summary = read_json(run_dir / "summary.json")
    saved = run_dir / ".hydra" / "config.yaml"
    if not isinstance(summary, dict) or not saved.is_file():
        raise UserError(f"{run_dir}: not a finished run dir (summary.json and .hydra/config.yaml are needed)")
    config.register()
    dict_cfg = OmegaConf.merge(OmegaConf.structured(config.ReflactConfig), OmegaConf.load(saved))
    cfg = config.validate(OmegaConf.to_object(dict_cfg))
    if tracking_uri:
        cfg.mlflow.tracking_uri = tracking_uri
    hydra_cfg = OmegaConf.load(run_dir / ".hydra" / "hydra.yaml") if (run_dir / ".hydra" / "hydra.yaml").is_file() else None
    sweep_dir = None
    if hydra_cfg is not None and str(hydra_cfg.hydra.mode) == "MULTIRUN":
        sweep_dir = (launch_dir / str(hydra_cfg.hydra.sweep.dir)).resolve()
    params = OmegaConf.to_container(dict_cfg, resolve=True)
    return log_run(cfg, params, summary, run_dir.resolve(), launch_dir, sweep_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Log a finished run dir into MLflow again.")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--tracking-uri", default=None, help="default: the run's own mlflow.tracking_uri")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from reflact.config import user_error_message

    try:
        run_id = relog(args.run_dir, Path.cwd(), args.tracking_uri)
    except Exception as exc:  # noqa: BLE001 - user mistakes in one line; bugs keep their traceback
        message = user_error_message(exc)
        if message is None:
            raise
        print(f"reflact: error: {message}", file=sys.stderr)
        return 2
    if run_id is None:
        return 1
    print(f"logged {args.run_dir} as MLflow run {run_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
