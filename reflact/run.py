"""The Hydra entry point: `python -m reflact.run +exp=demo` (add -m for a sweep)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from reflact import config
from reflact.errors import UserError


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def _job(dict_cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from reflact.experiment import run_experiment

    hc = HydraConfig.get()
    try:
        cfg = config.validate(OmegaConf.to_object(dict_cfg))
        params = OmegaConf.to_container(dict_cfg, resolve=True)
        sweep_dir = Path(hc.sweep.dir).resolve() if hc.mode == RunMode.MULTIRUN else None
        summary = run_experiment(
            cfg, params, Path(hc.runtime.output_dir), Path(hydra.utils.get_original_cwd()), sweep_dir
        )
    except Exception as exc:  # noqa: BLE001 - reported here, before Hydra wraps it in its own report
        _exit_if_user_error(exc)
        raise
    if summary["counts"]["minibatches_failed"] and not cfg.reflect.allow_failed_minibatches:
        print("reflact: some minibatches failed and reflect.allow_failed_minibatches=false", file=sys.stderr)
        sys.exit(1)


def main() -> None:
    config.register()
    # Hydra then raises instead of printing a multi-line report, so user mistakes get one line
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        _job()
    except Exception as exc:  # noqa: BLE001 - config errors raised while Hydra composes
        _exit_if_user_error(exc)
        raise


def _exit_if_user_error(exc: BaseException) -> None:
    message = config.user_error_message(exc)
    if message is not None:
        print(f"reflact: error: {message}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
