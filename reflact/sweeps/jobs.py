"""A sweep's jobs as their run dirs tell them, and the parent run's counts and figures over them.

The job dirs are the record: a job whose tracking store was down still ran, and its run dir says
how it ended (`mlflow_run.json`, INCOMPLETE with its run's status when its MLflow run could not be
written whole). The parent run's status and counts therefore come from the job dirs, never from
what the store happens to hold, and the jobs MLflow lacks are named with the command that writes
them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from reflact.running.rundir import RunDir, SweepDir
from reflact.tracking.store import analysis_metrics, total_metrics

ENDED = ("FINISHED", "FAILED", "KILLED")  # an MLflow run's end statuses, as a job dir records them
# on a parent some of whose jobs MLflow lacks: how many, and the command that writes them
NEEDS_RELOG_TAG = "reflact.needs_relog"


@dataclass(frozen=True)
class Job:
    run_dir: Path
    status: str  # FINISHED, FAILED or KILLED: how the job ended
    missing: bool  # its MLflow run lacks some of it, which relog can write (it got as far as its summary)
    metrics: dict[str, float] = field(default_factory=dict)  # its run metrics, as its MLflow run has them


def sweep_jobs(sweep: SweepDir, uri: str) -> list[Job]:
    """Every job dir of the sweep that got as far as its summary or its end, by path, against the
    store `uri`."""
    return [_job(run_dir, uri) for run_dir in sweep.jobs()]


def _job(run_dir: RunDir, uri: str) -> Job:
    record, summary = run_dir.mlflow_record(), run_dir.summary()
    logged = record.get("status") in ENDED and record.get("tracking_uri") == uri
    missing = summary is not None and not logged
    metrics: dict[str, float] = {}
    if summary is not None and isinstance(summary.get("counts"), dict):
        counts = {k: v for k, v in summary["counts"].items() if type(v) in (int, float)}  # damage counts nothing
        metrics = total_metrics(counts, dry_run=bool(counts.get("minibatches_dry_run")))
        metrics.update(analysis_metrics(run_dir.analysis() or {}))
    return Job(run_dir.root, _status(record, summary is not None), missing, metrics)


def _status(record: dict, summarised: bool) -> str:
    """How a job ended: its MLflow run's status, or, when that could not be written whole, its own;
    a run left RUNNING was killed. A job without a record (MLflow off when it ran) ended as its
    summary says it got there."""
    for status in (record.get("status"), record.get("run_status")):
        if status in ENDED:
            return str(status)
    return "FINISHED" if summarised and not record else "KILLED"


def parent_metrics(jobs: list[Job], failed_without_dir: int) -> dict[str, float]:
    """The parent's counts of its jobs (with the jobs a mistake stopped before they had a run dir
    among the failed ones) and figures over them: what was spent counts every job; a mean is over
    the finished ones (a failed job's figures are no result)."""
    statuses = [job.status for job in jobs] + ["FAILED"] * failed_without_dir
    metrics: dict[str, float] = {}
    finished = [job for job in jobs if job.status == "FINISHED"]
    # the means first, edits kept leading: MLflow's compare view opens on the first metric logged
    for key in ("edits_kept", "apply_share", "redundancy", "agreement"):
        values = [job.metrics[key] for job in finished if key in job.metrics]
        if values:
            metrics[f"{key}_mean"] = float(sum(values) / len(values))
    metrics["jobs"] = len(statuses)
    metrics.update({f"jobs_{s.lower()}": statuses.count(s) for s in ENDED})
    for key in ("cost_usd", "spent_usd", "calls"):
        values = [job.metrics[key] for job in jobs if key in job.metrics]
        if values:
            metrics[f"{key}_sum"] = float(sum(values))
    return metrics


def parent_status(jobs: list[Job], failed: bool) -> str:
    """KILLED if a job was stopped; FAILED if one failed (`failed`: also one without a run dir, or
    the sweep aborted); else FINISHED."""
    statuses = {job.status for job in jobs}
    if "KILLED" in statuses:
        return "KILLED"
    return "FAILED" if failed or "FAILED" in statuses else "FINISHED"


def needs_relog(jobs: list[Job], sweep_dir: Path, parent: bool = True) -> str:
    """What MLflow lacks of the sweep (its jobs, and its parent run when `parent` is false) and the
    one command that writes it, children and parent together ("" when it lacks nothing)."""
    missing = [job for job in jobs if job.missing]
    if parent and not missing:
        return ""
    lacking = [f"{len(missing)} of {len(jobs)} jobs" if missing else "", "" if parent else "the parent run"]
    return (
        f"{' and '.join(filter(None, lacking))} not wholly in MLflow (the tracking store failed); "
        f"python -m reflact.relog {sweep_dir} writes them and this sweep's figures"
    )
