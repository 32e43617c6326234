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

from reflact.errors import UserError, exits_on_user_error
from reflact.rundir import HYDRA, SUMMARY, RunDir


def relog(run_dir: Path, launch_dir: Path, tracking_uri: str | None) -> str | None:
    from omegaconf import OmegaConf

    from reflact import config
    from reflact.tracking import log_run

    rd = RunDir(run_dir)
    summary = rd.summary()
    saved = rd / HYDRA / "config.yaml"
    if summary is None or not saved.is_file():
        raise UserError(f"{run_dir}: not a finished run dir ({SUMMARY} and {HYDRA}/config.yaml are needed)")
    config.register()
    cfg, params = config.from_hydra(OmegaConf.load(saved))
    if tracking_uri:
        cfg.mlflow.tracking_uri = tracking_uri
    hydra_yaml = rd / HYDRA / "hydra.yaml"
    hydra_cfg = OmegaConf.load(hydra_yaml) if hydra_yaml.is_file() else None
    sweep_dir = None
    if hydra_cfg is not None and str(hydra_cfg.hydra.mode) == "MULTIRUN":
        sweep_dir = (launch_dir / str(hydra_cfg.hydra.sweep.dir)).resolve()
    return log_run(cfg, params, summary, run_dir.resolve(), launch_dir, sweep_dir)


@exits_on_user_error
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Log a finished run dir into MLflow again.")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--tracking-uri", default=None, help="default: the run's own mlflow.tracking_uri")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    run_id = relog(args.run_dir, Path.cwd(), args.tracking_uri)
    if run_id is None:
        return 1
    print(f"logged {args.run_dir} as MLflow run {run_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
