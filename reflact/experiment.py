"""One experiment, end to end: inputs, the stage (with progress and live tracking following it),
the run's summary and report, and the run's true status."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from reflact.analysis import analyse_run_dir
from reflact.analysis import warm as analysis_warm
from reflact.config import ReflactConfig
from reflact.dataset import load_dataset
from reflact.errors import Stopped
from reflact.live import LiveRun
from reflact.mirror import RunContext
from reflact.optimizer import make_optimizer
from reflact.rundir import RunDir, locked
from reflact.stage import Stage
from reflact.summary import run_status, summarize

log = logging.getLogger("reflact")


@dataclass
class Launch:
    """Where and how the run was started."""

    launch_dir: Path  # where relative paths and the default outputs/ are resolved
    sweep_dir: Path | None = None
    job: int | None = None  # the job's number in a sweep
    overrides: tuple[str, ...] = ()
    record_config: Callable[[], None] | None = None  # writes .hydra/ once the inputs passed their checks


@dataclass
class RunResult:
    run_dir: Path
    summary: dict
    status: str  # FINISHED or FAILED (a stopped run raises reflact.errors.Stopped)
    reason: str = ""  # why it failed, and what to check
    mlflow_run_id: str | None = None
    analysis: dict | None = None  # agreement, redundancy, distinct items (reflact.analysis)


def run_experiment(cfg: ReflactConfig, params: dict[str, str], run_dir: Path, launch: Launch) -> RunResult:
    """Everything that can be wrong with the inputs is found before the first call, and before
    `record_config` writes the run's config beside its outputs (a bad rerun changes nothing)."""
    started_at = time.time()
    dataset = load_dataset(cfg.data)
    optimizer = make_optimizer(cfg, launch.launch_dir, dataset.skill)
    stage = Stage(cfg, dataset, optimizer, run_dir)
    with locked(stage.run_dir):
        if launch.record_config is not None:
            launch.record_config()
        tracker = None
        if cfg.mlflow.enabled:
            tracker = LiveRun(RunContext(cfg, params, stage.run_dir, launch.launch_dir, started_at, dataset,
                                         stage.system, launch.overrides, launch.sweep_dir, launch.job))
            stage.observe(tracker)
        try:
            return _run(cfg, stage, optimizer, tracker, started_at)
        except KeyboardInterrupt as exc:
            if tracker is not None:
                tracker.finish(None, "KILLED")
            raise Stopped(f"{exc if isinstance(exc, Stopped) else 'interrupted'}: no new call was started; continue "
                          f"with the same hydra.run.dir={run_dir}", getattr(exc, "exit_code", 130)) from None
        except BaseException:  # a full disk, a bug: the MLflow run must not stay RUNNING
            if tracker is not None and not tracker.finished:
                tracker.finish(None, "FAILED")
            raise


def _run(cfg: ReflactConfig, stage: Stage, optimizer, tracker: LiveRun | None, started_at: float) -> RunResult:
    """The stage, then the run's summary and report, its status, and the end of its MLflow run."""
    dataset = stage.dataset
    if dataset.skipped:
        log.info("skipping %d run(s) without a usable conversation: %s", len(dataset.skipped),
                 ", ".join(sorted(dataset.skipped)[:10]) + (" ..." if len(dataset.skipped) > 10 else ""))
    # the analysis at the end imports numpy, scipy and rapidfuzz (~0.25 s): load them while the
    # process waits for its first replies (a dry run keeps no items to analyse)
    stage_ended = threading.Event()
    warming = threading.Thread(target=analysis_warm, args=(stage_ended,), daemon=True)
    if not cfg.optimizer.dry_run and cfg.analysis.max_items:
        warming.start()
    try:
        outcomes = stage.run()
    finally:
        optimizer.close()
        stage_ended.set()
    if warming.is_alive():  # a stage quicker than the warm-up: its imports end before the analysis imports
        warming.join()
    summary = summarize(stage.run_dir, cfg, dataset, stage.mode, outcomes, stage.system.hashes(), started_at,
                        time.time)
    analysis = analyse_run_dir(stage.run_dir, cfg.analysis.match_threshold, cfg.analysis.max_items)
    status, reason = run_status(summary["counts"], cfg, outcomes, stage.run_dir.root)
    run_id = tracker.finish(summary, status) if tracker is not None else None
    report_end(cfg, summary, stage.mode.label, stage.run_dir)
    report_analysis(analysis)
    return RunResult(stage.run_dir.root, summary, status, reason, run_id, analysis)


def report_end(cfg: ReflactConfig, summary: dict, label: str, run_dir: RunDir) -> None:
    """The run's last lines: what it did, and what needs a rerun."""
    c = summary["counts"]
    if cfg.optimizer.dry_run:
        log.info(
            "dry run: %d prompts built, ~%d prompt and ~%d reply tokens, estimated $%.4f for %s; prompts in %s",
            c["minibatches_dry_run"], c["tokens_prompt"], c["tokens_completion"], c["cost_usd"],
            cfg.optimizer.model, run_dir.calls,
        )
    else:
        log.info(
            "done: %d minibatches (%d new, %d reused, %d failed, %d skipped), %d calls, %d from cache, "
            "%d/%d %s kept, %d tokens, $%.4f spent now ($%.4f for all patches); outputs in %s",
            c["minibatches"], c["minibatches_done"], c["minibatches_reused"], c["minibatches_failed"],
            c["minibatches_skipped"], c["calls"], c["cache_hits"], c["edits_kept"], c["edits_proposed"],
            label, c["tokens_prompt"] + c["tokens_completion"], c["spent_usd"], c["cost_usd"], run_dir.root,
        )
    if c["minibatches_not_run"]:
        log.warning("the cost limit optimizer.max_cost_usd=%s was reached: %d minibatch(es) not run",
                    cfg.optimizer.max_cost_usd, c["minibatches_not_run"])
    if c["minibatches_failed"]:
        log.warning("%d minibatch(es) failed; rerun with the same hydra.run.dir to redo only those",
                    c["minibatches_failed"])


def report_analysis(analysis: dict) -> None:
    """One line of the run's agreement and redundancy (the whole of it is in the run dir)."""
    if "skipped" in analysis:
        log.info("analysis: %s", analysis["skipped"])
        return
    if not analysis["edits"]:
        return
    agreement = analysis.get("agreement")
    per_usd = analysis.get("distinct_edits_per_usd")
    log.info("analysis: %d kept items, %d distinct%s, redundancy %.2f%s (match threshold %.2f)",
             analysis["edits"], analysis["distinct_edits"], f" ({per_usd:.1f} per $)" if per_usd else "",
             analysis["redundancy"], "" if agreement is None else f", agreement over draws {agreement:.2f}",
             analysis["threshold"])
