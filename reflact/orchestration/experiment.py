"""One experiment, end to end: inputs, the stage (with progress and live tracking following it),
the run's summary and report, and the run's true status."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from reflact.analysis.figures import Run, analyse_run_dir, run_from
from reflact.analysis.figures import warm as analysis_warm
from reflact.analysis.matchers import matcher_for
from reflact.calls.deferred import Deferred, api_key
from reflact.calls.protocol import CHARS_PER_TOKEN, DRY_RUN_REPLY_TOKENS, DryRunEstimator, Optimizer
from reflact.config import AnalysisConfig, Execution, OptimizerConfig, Parts, how_to_price, priced
from reflact.core.errors import Stopped, StopSignal
from reflact.core.imports import one_at_a_time
from reflact.core.modes import Mode, get_mode
from reflact.inputs.dataset import Dataset
from reflact.inputs.source import load_input
from reflact.running.events import BatchNoted, Replied
from reflact.running.rundir import RunDir, SweepDir, locked
from reflact.running.stage import Stage, StageSettings
from reflact.running.summary import run_status, summarize, usd
from reflact.tracking.live import LiveRun
from reflact.tracking.nesting import check_parent
from reflact.tracking.process import RunContext, SpareTracker
from reflact.tracking.store import tracking_uri

if TYPE_CHECKING:  # batch execution's modules come with the OpenAI SDK: imported when a run batches
    from reflact.running.batch import Batching
    from reflact.running.batch_runner import Stop

log = logging.getLogger("reflact")


@dataclass
class Launch:
    """Where and how the run was started."""

    launch_dir: Path  # where relative paths and the default outputs/ are resolved
    sweep_dir: Path | None = None
    job: int | None = None  # the job's number in a sweep
    overrides: tuple[str, ...] = ()
    record_config: Callable[[], None] | None = None  # writes .hydra/ once the inputs passed their checks
    tracker: SpareTracker | None = None  # the process's idle tracker: started by the command line, or its last run's
    go_on: str = ""  # the command that goes on with a run whose batch is left to run
    signals: StopSignal | None = None  # Ctrl-C and SIGTERM as the command's handlers note them


@dataclass
class RunResult:
    run_dir: Path
    summary: dict
    patches: dict[str, dict]  # minibatch tag -> its patch as saved, in plan order
    status: str  # FINISHED or FAILED (a stopped run raises reflact.core.errors.Stopped)
    reason: str = ""  # why it failed, and what to check
    mlflow_run_id: str | None = None
    analysis: dict | None = None  # agreement, redundancy, distinct items (reflact.analysis.figures)


def run_experiment(parts: Parts, params: dict[str, str], run_dir: Path, launch: Launch) -> RunResult:
    """Everything that can be wrong with the inputs is found before the first call, and before
    `record_config` writes the run's config beside its outputs (a bad rerun changes nothing).
    `parts`: the checked config's sections (config.parts), `params`: its record (config.params)."""
    started_at = time.time()
    dataset = load_input(parts.data, parts.mlflow, parts.reflect, launch.launch_dir)
    if launch.sweep_dir is None:  # a sweep's jobs are children of its parent run, checked as it opened
        check_parent(parts.mlflow, tracking_uri(parts.mlflow, launch.launch_dir))
    settings = StageSettings(parts.reflect, parts.prompts, parts.optimizer)
    batching = (
        batching_for(settings, dataset, run_dir, launch) if parts.optimizer.execution is Execution.batch else None
    )
    mode, gate = get_mode(parts.reflect.update_mode), batching.gate if batching else None
    optimizer = make_optimizer(parts.optimizer, mode, launch.launch_dir, dataset.skill, gate=gate)
    stage = Stage(settings, dataset, optimizer, run_dir, signals=launch.signals)
    if batching is not None:  # over the cap, a request over the file limit: one line, nothing written
        batching.check()
    with locked(stage.run_dir), _closed(batching):
        if launch.record_config is not None:
            launch.record_config()
        if batching is not None:  # no Batch API: one line naming export, nothing uploaded, no MLflow run
            batching.first()
        tracker = _tracker(parts, params, stage, launch, started_at) if parts.mlflow.enabled else None
        try:
            stop = batching.finish(lambda notes, step: stage.publish(BatchNoted(notes, step))) if batching else None
            if stop is not None:
                return _left_to_run(stop, stage, optimizer, tracker)
            return _run(parts.analysis, stage, optimizer, tracker, started_at, launch.launch_dir)
        except BaseException as exc:
            stopped = stage.signals.stop_of(exc)
            if stopped is None:  # a full disk, a bug: the MLflow run must not stay RUNNING
                if tracker is not None and not tracker.finished:
                    tracker.finish(None, "FAILED")
                raise
            if tracker is not None:
                tracker.finish(None, "KILLED")
            raise Stopped(
                f"{stopped}: no new call was started; continue with the same hydra.run.dir={run_dir}",
                stopped.exit_code,
            ) from None


def batching_for(settings: StageSettings, dataset: Dataset, run_dir: Path, launch: Launch) -> Batching:
    """The run's batch (reflact.running.batch), its state in the run dir; a sweep's job also knows
    what its sweep's batch could not answer."""
    with one_at_a_time():  # the SDK comes with them
        from reflact.running.batch import Batching
        from reflact.running.batch_requests import Unit
        from reflact.running.batch_state import load_state

    go_on = launch.go_on or f"reflact.reflect(..., run_dir={str(run_dir)!r})"
    unit = Unit(settings, dataset, Path(run_dir))
    batching = Batching(RunDir(run_dir).batch_files(), [unit], RunDir(run_dir).root.name, launch.launch_dir, go_on)
    swept = load_state(SweepDir(launch.sweep_dir).batch_files()) if launch.sweep_dir is not None else None
    if swept is not None:
        batching.ledgers.append(swept)
    return batching


@contextlib.contextmanager
def _closed(batching: Batching | None):
    try:
        yield
    finally:
        if batching is not None:
            batching.close()


def _left_to_run(stop: Stop, stage: Stage, optimizer: Optimizer, tracker: LiveRun | None) -> RunResult:
    """A run whose batch is left to run: its MLflow run SCHEDULED (never FAILED), the one command
    that goes on said; `reason` when it was not asked to return (a fault, a batch past its wait)."""
    optimizer.close()
    run_id = tracker.finish(None, "SCHEDULED") if tracker is not None else None
    if not stop.fault:
        log.info("%s", stop.message)
    return RunResult(stage.run_dir.root, {}, {}, "SCHEDULED", stop.message if stop.fault else "", run_id)


def _tracker(parts: Parts, params: dict[str, str], stage: Stage, launch: Launch, started_at: float) -> LiveRun:
    """The run's live MLflow view, watching the stage's events."""
    context = RunContext(
        data=parts.data,
        reflect=parts.reflect,
        prompts=parts.prompts,
        optimizer=parts.optimizer,
        mlflow=parts.mlflow,
        params=params,
        run_dir=stage.run_dir,
        launch_dir=launch.launch_dir,
        started_at=started_at,
        dataset=stage.dataset,
        system=stage.system,
        overrides=launch.overrides,
        sweep_dir=launch.sweep_dir,
        job=launch.job,
    )
    tracker = LiveRun(context, launch.tracker)
    stage.observe(tracker)
    return tracker


def _run(
    a: AnalysisConfig, stage: Stage, optimizer, tracker: LiveRun | None, started_at: float, launch_dir: Path
) -> RunResult:
    """The stage, then the run's summary and report, its status, and the end of its MLflow run."""
    dataset, r, o = stage.dataset, stage.settings.reflect, stage.settings.optimizer
    warn_unpriced(o)
    if dataset.skipped:
        log.info(
            "skipping %d run(s) without a usable conversation: %s",
            len(dataset.skipped),
            ", ".join(sorted(dataset.skipped)[:10]) + (" ..." if len(dataset.skipped) > 10 else ""),
        )
    # the analysis at the end imports numpy, scipy and rapidfuzz (~0.25 s): load them while the
    # process waits for later replies (a dry run keeps no items to analyse)
    if not o.dry_run and a.max_items:
        stage.observe(WarmUp())
    try:
        outcomes = stage.run()
    finally:
        optimizer.close()
    hashes = stage.system.hashes()
    summary, kept = summarize(
        stage.run_dir, r, o, dataset, stage.mode, outcomes, stage.patches, hashes, started_at, time.time
    )
    stage.signals.check()  # the analysis may call too; a run stopped is KILLED, never FINISHED
    analysis = _analysis(a, o, stage, summary, run_from(stage.run_dir.root, summary, kept), launch_dir)
    stage.signals.check()
    status, reason = run_status(summary["counts"], r, o, outcomes, stage.run_dir.root, optimizer.fault)
    run_id = tracker.finish(summary, status) if tracker is not None else None
    if optimizer.fault and status == "FAILED":  # the reason says it all, in one line
        return RunResult(stage.run_dir.root, summary, stage.patches, status, reason, run_id, analysis)
    if optimizer.fault:
        log.warning("%s", optimizer.fault)
    report_end(o, summary, stage.mode.label, stage.run_dir)
    report_analysis(analysis)
    return RunResult(stage.run_dir.root, summary, stage.patches, status, reason, run_id, analysis)


class WarmUp:
    """Loads the analysis's libraries once the first reply is in, not before: until then the
    first requests are being made (the client imports the SDK under the import lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started = False

    def __call__(self, event) -> None:
        if not isinstance(event, Replied):
            return
        with self._lock:  # replies come on several workers at once: one thread, once
            if self._started:
                return
            self._started = True
        threading.Thread(target=analysis_warm, name="reflact-warm", daemon=True).start()


def _analysis(a: AnalysisConfig, o: OptimizerConfig, stage: Stage, summary: dict, run: Run, launch_dir: Path) -> dict:
    """The run's analysis.json by the configured matcher; its calls are capped by what the stage left."""
    if o.dry_run:  # nothing kept, nothing to embed: no endpoint is asked
        return analyse_run_dir(stage.run_dir, a.match_threshold, a.max_items, run)
    chosen = matcher_for(a, o, launch_dir, summary["counts"]["spent_usd"], stage.run_dir.calls / "analysis_judge")
    try:
        return analyse_run_dir(stage.run_dir, chosen, a.max_items, run)
    finally:
        chosen.close()


def warn_unpriced(o: OptimizerConfig) -> None:
    """Once per run: a model without a price has an unknown cost, shown so, never as $0."""
    if priced(o):
        return
    model = o.model
    log.warning(
        "optimizer.model %r has no price in optimizer.prices, so its cost is unknown (and no cost cap "
        "can hold); %s (USD per million tokens)",
        model,
        how_to_price(model),
    )


def report_end(o: OptimizerConfig, summary: dict, label: str, run_dir: RunDir) -> None:
    """The run's last lines: what it did, and what needs a rerun."""
    c = summary["counts"]
    log.info("%s", _last_line(o, c, label, run_dir))
    if c["minibatches_not_run"]:
        log.warning(
            "the cost limit optimizer.max_cost_usd=%s was reached: %d minibatch(es) not run",
            o.max_cost_usd,
            c["minibatches_not_run"],
        )
    if c["minibatches_failed"]:
        log.warning(
            "%d minibatch(es) failed; rerun with the same hydra.run.dir to redo only those", c["minibatches_failed"]
        )


def _last_line(o: OptimizerConfig, c: dict, label: str, run_dir: RunDir) -> str:
    if o.dry_run:
        return (
            f"dry run: {c['minibatches_dry_run']} prompts built, ~{c['tokens_prompt']} prompt and "
            f"~{c['tokens_completion']} reply tokens, estimated {usd(c['cost_usd'])} for {o.model}; "
            f"prompts in {run_dir.calls}"
        )
    return (
        f"done: {c['minibatches']} minibatches ({c['minibatches_done']} new, {c['minibatches_reused']} reused, "
        f"{c['minibatches_failed']} failed, {c['minibatches_skipped']} skipped), {c['calls']} calls, "
        f"{c['cache_hits']} from cache, {c['edits_kept']}/{c['edits_proposed']} {label} kept, "
        f"{c['tokens_prompt'] + c['tokens_completion']} tokens, {_spent(c)}; outputs in {run_dir.root}"
    )


def _spent(c: dict) -> str:
    if c["cost_usd"] is None:
        return "cost unknown (no price for the model)"
    return f"{usd(c['spent_usd'])} spent now ({usd(c['cost_usd'])} for all patches)"


def report_analysis(analysis: dict) -> None:
    """One line of the run's agreement and redundancy (the whole of it is in the run dir)."""
    if "skipped" in analysis:
        log.info("analysis: %s", analysis["skipped"])
        return
    if not analysis["edits"]:
        return
    agreement = analysis.get("agreement")
    per_usd = analysis.get("distinct_edits_per_usd")
    log.info(
        "analysis: %d kept items, %d distinct%s, redundancy %.2f%s (%s matcher, threshold %.2f)",
        analysis["edits"],
        analysis["distinct_edits"],
        f" ({per_usd:.1f} per $)" if per_usd else "",
        analysis["redundancy"],
        "" if agreement is None else f", agreement over draws {agreement:.2f}",
        analysis.get("matcher", "lexical"),
        analysis["threshold"],
    )
    if "analysis_cost_usd" in analysis:  # the matcher's own calls, beside the stage's
        log.info(
            "analysis by %s: %d tokens, $%.4f (%s)",
            analysis["matcher"],
            analysis["analysis_tokens"],
            analysis["analysis_cost_usd"],
            ", ".join(
                f"{kind}: {c['requests']} requests, {c['cache_hits']} from cache"
                for kind, c in analysis["analysis_calls"].items()
            ),
        )


def make_optimizer(
    o: OptimizerConfig,
    mode: Mode,
    launch_dir: Path,
    skill: str,
    environ: dict | None = None,
    gate: Callable | None = None,
) -> Optimizer:
    """The run's optimizer: the dry-run estimator, or the client built from `optimizer.*` (`gate`:
    batch execution's rule for what the cache does not answer, reflact.calls.client)."""
    if o.dry_run:
        tier = o.service_tier.value if o.service_tier.value != "auto" else ""
        return DryRunEstimator(DRY_RUN_REPLY_TOKENS + (len(skill) // CHARS_PER_TOKEN if mode.full_rewrite else 0), tier)
    api_key(o, os.environ if environ is None else environ)  # a missing key stops the run here

    def make() -> Optimizer:
        from reflact.calls.client import make_client

        return make_client(o, launch_dir, environ, gate)

    return Deferred(make)
