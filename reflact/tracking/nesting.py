"""Nesting under the caller's run: `mlflow.parent_run_id=<id>` makes the run (a sweep: its parent
run) a child of that run, in that run's experiment, as MLflow's UI nests them; in Python, the
caller's active `mlflow.start_run()` is the parent (and its store the run's, unless
mlflow.tracking_uri is set), the convention of GEPA's `mlflow_attach_existing` and of
`optimize_prompts`."""

from __future__ import annotations

import sys

from reflact.config import MlflowConfig
from reflact.core.errors import UserError
from reflact.core.imports import one_at_a_time
from reflact.core.text import one_line
from reflact.running.rundir import SweepDir
from reflact.tracking.process import RunContext

PARENT_TAG = "mlflow.parentRunId"
# how long a job's tracker waits for the sweep's parent run while it is opened beside the jobs
# (reflact.sweeps.keeper; a fresh sqlite store is migrated first); after it the job's run is one
# of its own, as when the parent could not be opened
PARENT_WAIT_S = 120.0


def under_active_run(m: MlflowConfig) -> None:
    """A caller inside `with mlflow.start_run():` gets the run as a child (parent_run_id unset)."""
    if m.parent_run_id or not m.enabled or "mlflow" not in sys.modules:
        return  # a caller with an active run has imported mlflow: nothing to import otherwise
    with one_at_a_time():
        import mlflow

    active = mlflow.active_run()
    if active is None:
        return
    m.parent_run_id = active.info.run_id
    m.tracking_uri = m.tracking_uri or mlflow.get_tracking_uri()


def check_parent(m: MlflowConfig, uri: str) -> None:
    """A parent that is no active run of the store is a mistake: one line, before any call."""
    parent = m.parent_run_id
    if not parent or not m.enabled:
        return
    with one_at_a_time():
        from mlflow import MlflowClient

    try:
        run = MlflowClient(tracking_uri=uri).get_run(parent)
    except Exception as exc:  # noqa: BLE001  # MLflow's reason, in the one line
        raise UserError(f"mlflow.parent_run_id: no run {parent} in {uri} ({one_line(exc, 160)})") from None
    if run.info.lifecycle_stage != "active":
        raise UserError(f"mlflow.parent_run_id: the run {parent} in {uri} is deleted")


def parent_of(uri: str, c: RunContext) -> str:
    """The run a run is a child of: its sweep's parent run (when in the same store; waited for
    while it is being opened beside the jobs), else mlflow.parent_run_id ("" if none)."""
    if c.sweep_dir is not None:
        parent = SweepDir(c.sweep_dir).parent_record(wait_s=PARENT_WAIT_S)
        return str(parent["run_id"]) if parent.get("tracking_uri") == uri else ""
    return c.mlflow.parent_run_id or ""


def nest(store, parent: str) -> None:
    """The store writes into the parent's experiment (MLflow nests runs within one experiment)."""
    store.experiment_id = store.client.get_run(parent).info.experiment_id
