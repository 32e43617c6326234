"""A multirun as one MLflow group: a parent run per sweep, opened as the jobs start and ended
with them, FINISHED, FAILED or KILLED, never left RUNNING.

Hydra runs this callback in the launching process. The sweep dir remembers the settings its jobs
share: a later sweep into the same dir with other fixed settings (data, model, mode, templates...)
is refused, so a sweep's runs and its grid report never mix them. The parent is opened and ended
by a process forked from the launching one (reflact.sweeps.keeper), so that the jobs need not wait
for mlflow's import; a sweep that waits for its batch, or nests under `mlflow.parent_run_id`, opens
it here first. (A fresh sqlite store is migrated once, under its lock, by whoever opens it first.)
Hydra only warns when a callback raises an Exception, so jobs do not rely on the parent: each
also carries the sweep id as a tag, and `python -m reflact.report` groups by that tag.

A job that fails (its run FAILED, or a mistake in its own settings) is recorded and the other
jobs run; the multirun then ends FAILED with exit code 1 and one line naming the failed jobs.
"""

from __future__ import annotations

import atexit
import logging
import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from reflact.config import param_text, unchanging
from reflact.core.errors import JobFailed, UserError, exits_on_user_error
from reflact.core.imports import one_at_a_time
from reflact.core.text import one_line
from reflact.running.newdir import unusable
from reflact.running.rundir import SweepDir
from reflact.sweeps.keeper import Keeper, can_fork, keep
from reflact.tracking.store import now_ms

log = logging.getLogger("reflact")


class MlflowSweep(Callback):
    def __init__(self) -> None:
        self._open: tuple | None = None  # (store, sweep dir) while the parent is RUNNING
        self._keeper: Keeper | None = None  # the process keeping the parent beside the jobs
        # Hydra 1.4 calls on_multirun_end after an on_multirun_start that ended on a mistake too
        self._started = False

    def __getstate__(self) -> dict:
        # a launcher's worker (joblib's, Ray's) gets this callback for on_job_end, which needs none
        # of the parent's store: sent along, it would make each worker import mlflow (seconds of
        # CPU) before its first job could start
        return {**self.__dict__, "_open": None, "_keeper": None}

    @exits_on_user_error  # a mismatch ends the sweep with one line and exit 2 (Hydra only warns)
    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        sweep_dir, launch_dir = _where(config)
        fixed, swept = sweep_settings(config)
        check_identity(SweepDir(sweep_dir), fixed, swept)
        SweepDir(sweep_dir).clear_failed_jobs()
        batching = _batching(config, sweep_dir, launch_dir)
        if batching is not None:  # over the cap, no Batch API: one line, nothing uploaded, no parent run
            batching.check()
            batching.first()
        if config.mlflow.enabled and batching is None and not config.mlflow.parent_run_id and can_fork():
            self._keep_parent(config, sweep_dir, launch_dir, fixed, swept)
        elif config.mlflow.enabled:  # a batch shows on the parent as the sweep waits for it; a given
            # parent run that is no run is a mistake to refuse before any job: opened here, first
            self._start_parent(config, sweep_dir, launch_dir, fixed, swept)
        self._started = True
        if batching is not None:
            self._batch(batching)

    def on_job_end(self, config: DictConfig, job_return, **kwargs) -> None:
        """Runs where the job ran (in a launcher's worker too): a failed job is recorded."""
        record_failed_job(config, job_return)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        if not self._started:  # its one line is printed: nothing ran
            return
        sweep = SweepDir(_where(config)[0])
        failed = sweep.failed_jobs()
        missing = self._ended(config, sweep, bool(failed)) if config.mlflow.enabled else ""
        if failed:
            print(f"reflact: sweep failed: {failed_jobs_line(failed, sweep)}", file=sys.stderr)
        if missing:  # the last line: what MLflow lacks, and the one command that writes it
            print(f"reflact: sweep {sweep.root}: {missing}", file=sys.stderr)
        if failed:
            raise SystemExit(1)  # not an Exception: Hydra would only warn

    def _keep_parent(self, config: DictConfig, sweep_dir: Path, launch_dir: Path, fixed: dict, swept: dict) -> None:
        from reflact.sweeps.grid_report import load_drawing

        def opening() -> None:
            self._start_parent(config, sweep_dir, launch_dir, fixed, swept)
            load_drawing()  # the keeper waits for the sweep's end anyway: the report then draws at once

        sweep = SweepDir(sweep_dir)
        self._keeper = keep(sweep, opening, lambda failed: self._end_parent(config, sweep, failed))
        atexit.register(self._end_if_open)  # a sweep that aborts (a failed job, Ctrl-C) still ends its parent

    def _ended(self, config: DictConfig, sweep: SweepDir, failed: bool) -> str:
        """Ends the parent, here or through its keeper; returns what MLflow lacks of the sweep."""
        missing = self._end_kept(failed)
        return missing if missing is not None else self._end_parent(config, sweep, failed)

    def _end_kept(self, failed: bool) -> str | None:
        """The keeper's answer once it ended the parent; None without a keeper (or one that died)."""
        keeper, self._keeper = self._keeper, None
        return keeper.end(failed) if keeper is not None else None

    def _end_parent(self, config: DictConfig, sweep: SweepDir, failed: bool) -> str:
        """Ends the parent run with the status and counts of its job dirs and the grid report;
        returns what MLflow lacks of the sweep, with the command that writes it ("" when nothing)."""
        from reflact.sweeps.grid_report import report_sweep
        from reflact.sweeps.jobs import needs_relog, sweep_jobs
        from reflact.tracking.store import tracking_uri

        uri = self._open[0].uri if self._open is not None else tracking_uri(_typed(config).mlflow, Path.cwd())
        jobs = sweep_jobs(sweep, uri)
        if self._open is None:  # the store failed as the sweep started: the parent is missing too
            return needs_relog(jobs, sweep.root, parent=False)
        store, _ = self._open
        try:
            report_sweep(store.client, sweep.parent_record()["sweep_id"], sweep.report, store.run_id)
            self._end(status_of_children(store, jobs, sweep, failed))
        except Exception as exc:  # the store failed at the sweep's end: the parent too is relog's
            self._open = None
            log.warning("the sweep's MLflow parent run could not be ended: %s", one_line(exc))
            return needs_relog(jobs, sweep.root, parent=False)
        return needs_relog(jobs, sweep.root)

    def _start_parent(self, config: DictConfig, sweep_dir: Path, launch_dir: Path, fixed: dict, swept: dict) -> None:
        from reflact.tracking.nesting import check_parent, nest
        from reflact.tracking.store import Store, tracking_uri

        m = _typed(config).mlflow
        store = Store(tracking_uri(m, launch_dir), m.experiment, launch_dir)
        sweep = SweepDir(sweep_dir)
        parent = m.parent_run_id
        if parent:  # the sweep's parent run is the child of that run, in its experiment
            check_parent(m, store.uri)
            nest(store, parent)
        open_parent(store, sweep, launch_dir, str(config.name), {**fixed, **listed(swept)}, parent)
        self._open = (store, sweep)
        atexit.register(self._end_if_open)  # a sweep that aborts (a failed job, Ctrl-C) still ends its parent

    def _batch(self, batching) -> None:
        """Sends the sweep's batch and waits for it (the parent RUNNING, showing it); when it is left
        to run, the parent is SCHEDULED, the one command that goes on is said, and no job runs."""
        from reflact.tracking.store import batch_view, end_run

        def shown(batches: list[dict], step: int) -> None:  # on the parent: its tags and metrics
            if self._open is not None:
                tags, metrics = batch_view(batches)
                self._open[0].log_metrics([(k, v, step) for k, v in metrics.items()], now_ms(), tags)

        try:
            stop = batching.finish(shown)
        except KeyboardInterrupt:
            if self._open is not None:
                self._end("KILLED")
            raise
        finally:
            batching.close()
        if stop is None:
            return
        if self._open is not None:
            end_run(self._open[0], "SCHEDULED", now_ms())
            self._open = None  # left SCHEDULED: never ended at exit
        print(f"reflact: {stop.message}", file=sys.stderr)
        raise SystemExit(1 if stop.fault else 0)

    def _end_if_open(self) -> None:
        self._end_kept(failed=True)
        if self._open is not None:
            from reflact.sweeps.jobs import sweep_jobs

            store, sweep = self._open
            try:
                self._end(status_of_children(store, sweep_jobs(sweep, store.uri), sweep, failed=True))
            except Exception as exc:  # the process is ending: say so, do not raise
                log.warning("could not end the sweep's MLflow parent run %s: %s", store.run_id, exc)

    def _end(self, status: str) -> None:
        assert self._open is not None  # called only while the parent is open
        store, _ = self._open
        self._open = None
        store.end(status, now_ms())


def record_failed_job(config: DictConfig, job_return) -> None:
    """A job that failed as a run or on a mistake (JobFailed, its line printed) is recorded in the
    sweep dir and handed back as completed, its failure as its value: a sweeper raises a failed
    job's exception when it reads the value (after the batch, or at once), which would end the
    sweep; Optuna still counts the trial failed (the value is no number). A bug keeps Hydra's way:
    its traceback."""
    with one_at_a_time():
        from hydra.core.utils import JobStatus

    failure = job_return._return_value  # the public property raises it
    if job_return.status != JobStatus.FAILED or not isinstance(failure, JobFailed):
        return
    SweepDir(Path(config.hydra.sweep.dir).resolve()).write_failed_job(
        int(config.hydra.job.num),
        {
            "overrides": list(config.hydra.overrides.task),
            "run_dir": config.hydra.runtime.output_dir,
            "reason": str(failure),
        },
    )
    job_return.status = JobStatus.COMPLETED
    job_return.return_value = failure


def open_parent(
    store, sweep: SweepDir, launch_dir: Path, name: str, params: dict[str, str], parent: str | None = None
) -> None:
    """The sweep's parent run in `store` (its id then `store.run_id`), RUNNING: the one its dir
    names when that is still there (the same sweep again), else a new one, named in the dir."""
    from reflact.tracking.store import sweep_id

    known = sweep.parent_record() or sweep.parent_set_aside()
    if known.get("tracking_uri") == store.uri and _alive(store, known["run_id"]):
        store.run_id = known["run_id"]
        store.client.update_run(store.run_id, status="RUNNING")
        return
    sid = sweep_id(sweep.root, launch_dir)
    tags = {"reflact.sweep_id": sid, "reflact.sweep_parent": "true"}
    tags.update({"mlflow.parentRunId": parent} if parent else {})
    store.create(f"sweep {name}", tags, now_ms())
    sweep.write_parent_record({"run_id": store.run_id, "tracking_uri": store.uri, "sweep_id": sid})
    store.log_params(params)
    log.info("MLflow parent run %s for sweep %s", store.run_id, sid)


def _batching(config: DictConfig, sweep_dir: Path, launch_dir: Path):
    """The sweep's batch (reflact.sweeps.batch), when a job runs with optimizer.execution=batch."""
    from reflact.sweeps.batch import sweep_batching

    return sweep_batching(config, sweep_dir, launch_dir)


def listed(swept: dict[str, list[str]]) -> dict[str, str]:
    """The swept keys as params: each its values, comma-separated (cut as every param is)."""
    return {key: param_text(",".join(values)) for key, values in swept.items()}


def sweep_settings(config: DictConfig) -> tuple[dict[str, str], dict[str, list[str]]]:
    """(the settings every job shares, as params; the swept keys and their values). Settings that do
    not change results (reflact.config.UNCHANGING: workers, key variable, prices, tracking...) are left out."""
    with one_at_a_time():
        from hydra.core.override_parser.overrides_parser import OverridesParser

    from reflact.config import params

    parser = OverridesParser.create()
    sweeper_params = [f"{key}={value}" for key, value in (config.hydra.sweeper.get("params") or {}).items()]
    swept = {o.key_or_group: swept_values(o) for o in parser.parse_overrides(sweeper_params)}
    # the command line wins over the sweeper's params, as in Hydra's sweepers: one value there fixes the key
    for override in parser.parse_overrides(list(config.hydra.overrides.task)):
        if override.is_sweep_override():
            swept[override.key_or_group] = swept_values(override)
        else:
            swept.pop(override.key_or_group, None)
    fixed = {k: v for k, v in params(_typed(config)).items() if k not in swept and not unchanging(k)}
    return fixed, swept


def swept_values(override) -> list[str]:
    """The values a swept key lists: `2,4,8`, `choice(2,4,8)` and `range(1,5)` item by item. What
    a sampler draws from (Optuna's `interval(1,4)`), a glob or a single value stays as written."""
    with one_at_a_time():
        from hydra.core.override_parser.types import Glob

    listed = override.is_choice_sweep() or override.is_range_sweep()
    if listed and not isinstance(override.value(), Glob):
        return list(override.sweep_string_iterator())
    return [override.input_line.split("=", 1)[1]]


# the grid's axes: the report keeps modes, M and L apart and averages over seeds, so a sweep dir may
# gather any of their values (more seeds another day, say)
GRID_AXES = ("reflect.update_mode", "reflect.minibatch_size", "reflect.edit_budget", "reflect.seed")


def check_identity(sweep: SweepDir, fixed: dict[str, str], swept: dict[str, list[str]]) -> None:
    """Refuses a sweep into a dir whose earlier sweep fixed a shared setting (data, model, templates,
    decoding...) to another value; the grid's axes and keys swept by either may differ."""
    earlier = sweep.identity()
    old = earlier.get("fixed", {})
    may_vary = set(GRID_AXES) | set(earlier.get("swept", {})) | set(swept)
    # a setting set on one side only differs too (params leave unset settings out); a dir made
    # before a setting counted as unchanging may still hold it: it is not compared
    differing = [
        k
        for k in sorted(set(old) | set(fixed))
        if old.get(k) != fixed.get(k) and k not in may_vary and not unchanging(k)
    ]
    if earlier and differing:
        shown = "; ".join(f"{k}: {old.get(k, 'unset')!r} there, {fixed.get(k, 'unset')!r} now" for k in differing[:3])
        raise UserError(
            f"{sweep.root} holds a sweep with other fixed settings ({shown}); give this sweep its own "
            "name=... (or hydra.sweep.dir=...)"
        )
    old = {k: v for k, v in old.items() if not unchanging(k)}
    sweep.write_identity({"fixed": {**old, **fixed}, "swept": {**earlier.get("swept", {}), **swept}})


def failed_jobs_line(failed: list[dict], sweep: SweepDir) -> str:
    """The failed jobs, by number and overrides, with what to do: one line."""
    shown = "; ".join(f"#{r['job']} {' '.join(r.get('overrides', []))} ({r.get('reason', '')})" for r in failed)
    return (
        f"{len(failed)} job(s) failed, the others ran: {shown}; their run dirs are under {sweep.root}, "
        "and the same command again redoes only what is missing"
    )


def status_of_children(store, jobs: list, sweep: SweepDir, failed: bool) -> str:
    """The parent's status from its job dirs (reflact.sweeps.jobs), never from what the store holds:
    KILLED if a job was stopped; FAILED if one failed (`failed`: also one without a run dir, or the
    sweep aborted); else FINISHED. Also logs the parent's counts and figures over its jobs, so a
    collapsed sweep still charts, and its description (reflact.tracking.description: the grid, the
    jobs, edits kept, cost); a tag and the description say which jobs MLflow lacks and the command
    that writes them (the tag removed once nothing is missing)."""
    from reflact.sweeps.jobs import NEEDS_RELOG_TAG, needs_relog, parent_metrics, parent_status
    from reflact.tracking.description import note_tags, parent_description

    dirs = {str(job.run_dir) for job in jobs}
    without_dir = [r for r in sweep.failed_jobs() if str(Path(str(r.get("run_dir", ""))).resolve()) not in dirs]
    missing = needs_relog(jobs, sweep.root)
    metrics = parent_metrics(jobs, len(without_dir))
    held = store.client.get_run(store.run_id).data.tags
    identity = sweep.identity()
    text = parent_description(identity.get("fixed", {}), identity.get("swept", {}), metrics, missing)
    tags = {**note_tags(text, held), **({NEEDS_RELOG_TAG: missing} if missing else {})}
    store.log_metrics([(k, float(v), 0) for k, v in metrics.items()], now_ms(), tags)
    if not missing and NEEDS_RELOG_TAG in held:  # repaired: what the parent said is no longer so
        store.client.delete_tag(store.run_id, NEEDS_RELOG_TAG)
    return parent_status(jobs, failed)


def _typed(config: DictConfig):
    from reflact.config import from_hydra

    job_config = OmegaConf.masked_copy(config, [str(k) for k in config if k != "hydra"])
    return from_hydra(job_config)[0]


def _where(config: DictConfig) -> tuple[Path, Path]:
    """(sweep dir, launch dir) for this multirun."""
    with one_at_a_time():
        from hydra.core.hydra_config import HydraConfig

    HydraConfig.instance().set_config(config)  # lets `${hydra:...}` in the sweep dir resolve
    sweep_dir = Path(config.hydra.sweep.dir).resolve()
    try:
        sweep_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise unusable(sweep_dir, "hydra.sweep.dir", exc) from None
    return sweep_dir, Path.cwd()


def _alive(store, run_id: str) -> bool:
    try:
        return store.client.get_run(run_id).info.lifecycle_stage == "active"
    except Exception:  # deleted or from another store
        return False
