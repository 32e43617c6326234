"""A sweep's batch (reflact.running.batch): every job's requests in one batch, sent and collected
as the sweep starts, before any job runs; each job then runs as usual, answered from the cache.

The multirun's callback (reflact.sweeps.sweep) calls `sweep_batching`: the jobs Hydra's basic
sweeper will launch are listed from the same overrides (its own `params`, then the command
line's), each composed as its launcher will compose it (its run dir included), and their
conversations looked at together, so a request two cells share is one line. A job whose settings
are a mistake is left to fail on its own; jobs of another endpoint or response cache than the
first's, and every job of a sweeper that picks its jobs as it goes (Optuna), batch on their own
when they run (their run dir's `batch/`).
"""

from __future__ import annotations

import logging
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig, OmegaConf

from reflact.config import Execution, OptimizerConfig, from_hydra
from reflact.core.errors import UserError
from reflact.core.imports import one_at_a_time
from reflact.core.launch import LaunchDir
from reflact.inputs.dataset import Dataset
from reflact.inputs.source import load_input
from reflact.running.batch_requests import Unit
from reflact.running.rundir import SweepDir
from reflact.running.stage import StageSettings

if TYPE_CHECKING:  # batch execution comes with the OpenAI SDK: imported when a job batches
    from reflact.running.batch import Batching

log = logging.getLogger("reflact")
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def sweep_batching(config: DictConfig, sweep_dir: Path, launch_dir: Path) -> Batching | None:
    """The batch of the sweep's jobs that run with optimizer.execution=batch (None when none does)."""
    if not might_batch(config):  # a live sweep composes no job here
        return None
    units = [unit for unit in job_units(config, launch_dir) if unit.settings.optimizer.execution is Execution.batch]
    if not units:
        return None
    with one_at_a_time():  # the SDK comes with it
        from reflact.running.batch import Batching

    together = [unit for unit in units if _shared(unit.settings.optimizer, units[0].settings.optimizer, launch_dir)]
    if len(together) < len(units):
        log.info("%d job(s) of another endpoint or response cache batch on their own", len(units) - len(together))
    go_on = shlex.join(["python", "-m", "reflact.run", *sys.argv[1:]])
    return Batching(SweepDir(sweep_dir).batch_files(), together, str(config.name), launch_dir, go_on)


def might_batch(config: DictConfig) -> bool:
    """Whether a job may run with optimizer.execution=batch: the sweep's own setting, or an override
    or sweeper param naming it."""
    own = config.optimizer.get("execution")
    named = [*config.hydra.overrides.task, *(config.hydra.sweeper.get("params") or {})]
    return getattr(own, "value", own) == "batch" or any("optimizer.execution" in str(o) for o in named)


def job_units(config: DictConfig, launch_dir: Path) -> list[Unit]:
    """Each job the basic sweeper will launch, composed as its launcher composes it; none for
    another sweeper."""
    if config.hydra.sweeper.get("_target_") != BASIC_SWEEPER:
        return []
    with one_at_a_time():
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.global_hydra import GlobalHydra
        from hydra.core.hydra_config import HydraConfig
        from hydra.core.override_parser.overrides_parser import OverridesParser

    loader = GlobalHydra.instance().config_loader()
    params = [f"{key}={value}" for key, value in (config.hydra.sweeper.get("params") or {}).items()]
    given = OverridesParser.create(config_loader=loader).parse_overrides(params + list(config.hydra.overrides.task))
    datasets: dict[str, Dataset] = {}
    units = []
    try:
        for overrides in BasicSweeper.split_arguments(given, None)[0]:
            job = loader.load_sweep_config(config, list(overrides))
            HydraConfig.instance().set_config(job)  # the job's folder name resolves against its own config
            units.append(_unit(job, datasets, launch_dir))
    finally:
        HydraConfig.instance().set_config(config)
    return [unit for unit in units if unit is not None]


def _unit(job: DictConfig, datasets: dict[str, Dataset], launch_dir: Path) -> Unit | None:
    """A job's settings, dataset and run dir; None when its settings or inputs are a mistake (the
    job itself says so when it runs)."""
    run_dir = Path(str(OmegaConf.select(job, "hydra.sweep.dir"))) / str(OmegaConf.select(job, "hydra.sweep.subdir"))
    try:
        cfg = from_hydra(OmegaConf.masked_copy(job, [str(k) for k in job if k != "hydra"]))[0]
        data = repr(cfg.data)
        if data not in datasets:
            datasets[data] = load_input(cfg.data, cfg.mlflow, cfg.reflect, launch_dir)
    except UserError:
        return None
    return Unit(StageSettings(cfg.reflect, cfg.prompts, cfg.optimizer), datasets[data], run_dir.resolve())


def _shared(a: OptimizerConfig, b: OptimizerConfig, launch_dir: Path) -> bool:
    """Whether a job (`a`) reaches the same server and response cache as the first (`b`): one batch serves both."""
    same_cache = LaunchDir(launch_dir).cache(a.cache_path) == LaunchDir(launch_dir).cache(b.cache_path)
    return same_cache and (a.provider, a.base_url, a.azure, a.api_key_env) == (
        b.provider,
        b.base_url,
        b.azure,
        b.api_key_env,
    )
