"""One experiment, end to end: inputs, the stage, the run's summary and report, then tracking."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable

from reflact.config import ReflactConfig
from reflact.dataset import load_dataset
from reflact.optimizer import make_optimizer
from reflact.rundir import RunDir
from reflact.stage import Stage
from reflact.summary import summarize
from reflact.tracking import log_run

log = logging.getLogger("reflact")


def run_experiment(
    cfg: ReflactConfig,
    params: dict[str, str],
    run_dir: Path,
    launch_dir: Path,
    sweep_dir: Path | None = None,
    record_config: Callable[[], None] | None = None,
) -> dict:
    """Everything that can be wrong with the inputs is found before the first call, and before
    `record_config` writes the run's config beside its outputs (a bad rerun changes nothing)."""
    started = time.monotonic()
    dataset = load_dataset(cfg.data)
    optimizer = make_optimizer(cfg, launch_dir, dataset.skill)
    stage = Stage(cfg, dataset, optimizer, run_dir)
    if record_config is not None:
        record_config()
    if dataset.skipped:
        log.info("skipping %d run(s) without a usable conversation: %s", len(dataset.skipped),
                 ", ".join(sorted(dataset.skipped)[:10]) + (" ..." if len(dataset.skipped) > 10 else ""))
    try:
        outcomes = stage.run()
    finally:
        optimizer.close()
    summary = summarize(stage.run_dir, cfg, dataset, stage.mode, outcomes, stage.system.hashes(), started,
                        time.monotonic)
    if cfg.mlflow.enabled:
        log_run(cfg, params, summary, run_dir, launch_dir, sweep_dir)
    report_end(cfg, summary, stage.mode.label, run_dir)
    return summary


def report_end(cfg: ReflactConfig, summary: dict, label: str, run_dir: Path) -> None:
    """The run's last lines: what it did, and what needs a rerun."""
    c = summary["counts"]
    if cfg.optimizer.dry_run:
        log.info(
            "dry run: %d prompts built, ~%d prompt and ~%d reply tokens, estimated $%.4f for %s; prompts in %s",
            c["minibatches_dry_run"], c["tokens_prompt"], c["tokens_completion"], c["cost_usd"],
            cfg.optimizer.model, RunDir(run_dir).calls,
        )
    else:
        log.info(
            "done: %d minibatches (%d new, %d reused, %d failed, %d skipped), %d calls, %d from cache, "
            "%d/%d %s kept, %d tokens, $%.4f spent now ($%.4f for all patches); outputs in %s",
            c["minibatches"], c["minibatches_done"], c["minibatches_reused"], c["minibatches_failed"],
            c["minibatches_skipped"], c["calls"], c["cache_hits"], c["edits_kept"], c["edits_proposed"],
            label, c["tokens_prompt"] + c["tokens_completion"], c["spent_usd"], c["cost_usd"], run_dir,
        )
    if c["minibatches_not_run"]:
        log.warning("the cost limit optimizer.max_cost_usd=%s was reached: %d minibatch(es) not run",
                    cfg.optimizer.max_cost_usd, c["minibatches_not_run"])
    if c["minibatches_failed"]:
        log.warning("%d minibatch(es) failed; rerun with the same hydra.run.dir to redo only those",
                    c["minibatches_failed"])
