"""The Hydra entry point: `python -m reflact.run +exp=demo` (add -m for a sweep)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from reflact import config


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def _job(dict_cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from reflact.experiment import run_experiment

    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    try:
        # merging into the schema also rejects keys added with `+`, which Hydra lets through
        typed = OmegaConf.merge(OmegaConf.structured(config.ReflactConfig), OmegaConf.to_container(dict_cfg))
        cfg = config.validate(OmegaConf.to_object(typed))
        params = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True, enum_to_str=True)
        sweep_dir = Path(hc.sweep.dir).resolve() if hc.mode == RunMode.MULTIRUN else None
        summary = run_experiment(
            cfg, params, run_dir, Path(hydra.utils.get_original_cwd()), sweep_dir,
            record_config=lambda: _record_config(dict_cfg, hc, run_dir),
        )
    except Exception as exc:  # noqa: BLE001 - reported here, before Hydra wraps it in its own report
        _exit_if_user_error(exc)
        raise
    if summary["counts"]["minibatches_failed"] and not cfg.reflect.allow_failed_minibatches:
        print("reflact: some minibatches failed and reflect.allow_failed_minibatches=false", file=sys.stderr)
        sys.exit(1)


def _record_config(dict_cfg: DictConfig, hc: DictConfig, run_dir: Path) -> None:
    """What Hydra would write to .hydra/ (hydra.output_subdir is off), written only once the
    config and inputs passed their checks, so a mistaken rerun leaves the record alone."""
    from reflact.files import write_text

    folder = run_dir / ".hydra"
    write_text(folder / "config.yaml", OmegaConf.to_yaml(dict_cfg))
    write_text(folder / "hydra.yaml", OmegaConf.to_yaml({"hydra": hc}))
    write_text(folder / "overrides.yaml", OmegaConf.to_yaml(list(hc.overrides.task)))


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
