"""A multirun as one MLflow group: a parent run per sweep, opened before the jobs start and ended
with them, FINISHED, FAILED or KILLED, never left RUNNING.

Hydra runs this callback in the launching process. The sweep dir remembers the settings its jobs
share: a later sweep into the same dir with other fixed settings (data, model, mode, templates...)
is refused, so a sweep's runs and its grid report never mix them. Opening the parent also creates
the experiment, which migrates a fresh sqlite store once, before parallel jobs could race on it.
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

from reflact.config import unchanging
from reflact.errors import JobFailed, UserError, exits_on_user_error
from reflact.imports import one_at_a_time
from reflact.running.newdir import unusable
from reflact.running.rundir import SweepDir
from reflact.tracking.store import now_ms

log = logging.getLogger("reflact")


class MlflowSweep(Callback):
    def __init__(self) -> None:
        self._open: tuple | None = None  # (store, sweep dir) while the parent is RUNNING
        # Hydra 1.4 calls on_multirun_end after an on_multirun_start that ended on a mistake too
        self._started = False

    @exits_on_user_error  # a mismatch ends the sweep with one line and exit 2 (Hydra only warns)
    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        sweep_dir, launch_dir = _where(config)
        fixed, swept = sweep_settings(config)
        check_identity(SweepDir(sweep_dir), fixed, swept)
        SweepDir(sweep_dir).clear_failed_jobs()
        if config.mlflow.enabled:
            self._start_parent(config, sweep_dir, launch_dir, fixed, swept)
        self._started = True

    def on_job_end(self, config: DictConfig, job_return, **kwargs) -> None:
        """Runs where the job ran (in a launcher's worker too). A job that failed as a run or on a
        mistake (JobFailed, its line printed) is recorded in the sweep dir and handed back as
        completed, its failure as its value: a sweeper raises a failed job's exception when it
        reads the value (after the batch, or at once), which would end the sweep; Optuna still
        counts the trial failed (the value is no number). A bug keeps Hydra's way: its traceback."""
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

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        if not self._started:  # its one line is printed: nothing ran
            return
        sweep = SweepDir(_where(config)[0])
        failed = sweep.failed_jobs()
        if self._open is not None:
            from reflact.sweeps.grid_report import report_sweep

            store, _ = self._open
            report_sweep(store.client, sweep.parent_record()["sweep_id"], sweep.report, store.run_id)
            self._end(status_of_children(store, sweep, failed=bool(failed)))
        if failed:
            print(f"reflact: sweep failed: {failed_jobs_line(failed, sweep)}", file=sys.stderr)
            raise SystemExit(1)  # not an Exception: Hydra would only warn

    def _start_parent(self, config: DictConfig, sweep_dir: Path, launch_dir: Path, fixed: dict, swept: dict) -> None:
        from reflact.tracking.store import Store, sweep_id, tracking_uri

        cfg = _typed(config)
        store = Store(tracking_uri(cfg, launch_dir), cfg.mlflow.experiment, launch_dir)
        sweep = SweepDir(sweep_dir)
        known = sweep.parent_record()
        if known.get("tracking_uri") == store.uri and _alive(store, known["run_id"]):
            store.run_id = known["run_id"]
            store.client.update_run(store.run_id, status="RUNNING")  # the same sweep again: resume its parent
        else:
            sid = sweep_id(sweep_dir, launch_dir)
            store.create(f"sweep {config.name}", {"reflact.sweep_id": sid, "reflact.sweep_parent": "true"}, now_ms())
            sweep.write_parent_record({"run_id": store.run_id, "tracking_uri": store.uri, "sweep_id": sid})
            store.log_params({**fixed, **{key: ",".join(values) for key, values in swept.items()}})
            log.info("MLflow parent run %s for sweep %s", store.run_id, sid)
        self._open = (store, sweep)
        atexit.register(self._end_if_open)  # a sweep that aborts (a failed job, Ctrl-C) still ends its parent

    def _end_if_open(self) -> None:
        if self._open is not None:
            store, sweep = self._open
            try:
                self._end(status_of_children(store, sweep, failed=True))
            except Exception as exc:  # the process is ending: say so, do not raise
                log.warning("could not end the sweep's MLflow parent run %s: %s", store.run_id, exc)

    def _end(self, status: str) -> None:
        assert self._open is not None  # called only while the parent is open
        store, _ = self._open
        self._open = None
        store.end(status, now_ms())


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


def status_of_children(store, sweep: SweepDir, failed: bool) -> str:
    """KILLED if a job was stopped; FAILED if one failed (`failed`: also one without a run, or the
    sweep aborted); else FINISHED.
    Also logs the parent's metrics over its jobs, so a collapsed sweep still charts."""
    from reflact.sweeps.grid_report import finished, sweep_runs

    runs = sweep_runs(store.client, sweep.parent_record().get("sweep_id", ""))
    statuses = list(runs["status"]) if "status" in runs else []
    metrics: dict[str, float] = {
        "jobs": len(statuses),
        **{f"jobs_{s.lower()}": statuses.count(s) for s in ("FINISHED", "FAILED", "KILLED")},
    }
    # what was spent counts every job; a mean is over the finished ones (a failed job's figures are no result)
    for key, how, over in (
        ("cost_usd", "sum", runs),
        ("spent_usd", "sum", runs),
        ("calls", "sum", runs),
        *((key, "mean", finished(runs)) for key in ("edits_kept", "apply_share", "redundancy", "agreement")),
    ):
        if key in over and over[key].notna().any():
            metrics[f"{key}_{how}"] = float(getattr(over[key], how)())
    store.log_metrics([(k, float(v), 0) for k, v in metrics.items()], now_ms())
    if "KILLED" in statuses:
        return "KILLED"
    return "FAILED" if failed or "FAILED" in statuses or "RUNNING" in statuses else "FINISHED"


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
