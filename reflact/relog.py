"""Log a finished run dir into MLflow again, e.g. after the tracking store was unreachable:

    python -m reflact.relog RUN_DIR [--tracking-uri URI]
    python -m reflact.relog SWEEP_DIR [--tracking-uri URI]   (every job MLflow lacks, and the parent)

Run it from the directory the run was started from (the default store is outputs/mlflow.db
there). Nothing is called and nothing in the run dir changes but its record of the MLflow run.
The run is written by the same code as live tracking, from the run dir's records, so it holds
the same names and values, every request's trace included (from the run dir's traces.jsonl). A
job of a sweep is attached to the sweep's parent run again when that run is in the same store.
Every record is read and checked before the MLflow run is created: a damaged one is one line and
exit code 2 with no run created (a damaged trace record is left out, with one line), so a run
relog opens is one it can finish.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

from reflact.core.errors import UserError, exits_on_user_error, own_lines_shown
from reflact.running.rundir import HYDRA, SUMMARY, RunDir, SweepDir, TraceRecords, recorded_requests

if TYPE_CHECKING:
    from reflact.config import OptimizerConfig
    from reflact.tracking.process import RunContext

log = logging.getLogger("reflact")


def relog(run_dir: Path, launch_dir: Path, tracking_uri: str | None) -> str | None:
    """Logs the run dir as a new MLflow run (replacing the one it had); returns its id, or None
    (with a warning) when tracking failed."""
    from reflact.core.text import one_line
    from reflact.tracking.mirror import Mirror
    from reflact.tracking.store import Store, mlflow_globals_at

    rd = RunDir(run_dir.resolve())
    if rd.summary() is None or not (rd / HYDRA / "config.yaml").is_file():
        raise UserError(f"{run_dir}: not a finished run dir ({SUMMARY} and {HYDRA}/config.yaml are needed)")
    read = _read(rd, launch_dir, tracking_uri)  # everything, checked, before a run is created
    uri = read.uri
    mirror = None
    try:
        with mlflow_globals_at(uri):
            mirror = Mirror(Store(uri, read.context.mlflow.experiment, launch_dir), read.context)
            run_id = mirror.open()
            mirror.write(read.events)
            if read.context.mlflow.trace_calls:
                mirror.store.traces(read.requests, read.context.optimizer.model)
            mirror.end(read.summary, read.status, read.ended_ms)
    except UserError:  # a store no retry opens (half-migrated): what to do, in one line
        raise
    except Exception as exc:  # the store's failure, in one line
        log.warning("MLflow logging to %s failed: %s", uri, one_line(exc))
        if mirror is not None and mirror.store.run_id:  # its status, and what it lacks: never left RUNNING
            with contextlib.suppress(Exception):
                mirror.abandon(read.status, read.ended_ms, one_line(exc))
        return None
    rd.write_mlflow_record({"run_id": run_id, "tracking_uri": uri, "status": read.status})
    return run_id


@dataclass
class Read:
    """What relog logs, read from the run dir and checked."""

    context: RunContext
    uri: str  # the store: --tracking-uri, else the run's own
    summary: dict
    status: str
    events: list
    requests: list  # the trace records, as the events their traces are written from
    ended_ms: int


def _read(rd: RunDir, launch_dir: Path, tracking_uri: str | None) -> Read:
    """Every file relog reads (its summary, saved config and Hydra's, analysis, kept items, patches
    and trace records), checked: a damaged one is one line before any MLflow run exists."""
    from reflact.analysis.records import check_kept_items, checked_analysis, loggable_summary
    from reflact.running.summary import run_status

    summary = loggable_summary(rd.root)  # the shape the stage writes, or one line naming the damage
    context = _context(rd, launch_dir, tracking_uri, summary)
    outcomes = _outcomes(summary, context.optimizer, rd)
    status, _ = run_status(summary["counts"], context.reflect, context.optimizer, outcomes, rd.root)
    checked_analysis(rd.root)
    check_kept_items(rd.root)
    records = TraceRecords(rd)
    requests = recorded_requests(records.of(), records.path) if context.mlflow.trace_calls else []
    ended_ms = int(summary.get("times", {}).get("ended_at", time.time()) * 1000)
    uri = str(context.mlflow.tracking_uri)  # _context set it
    return Read(context, uri, summary, status, _events(rd, summary, outcomes), requests, ended_ms)


def _context(rd: RunDir, launch_dir: Path, tracking_uri: str | None, summary: dict):
    """The run's context from its saved config (its dataset and templates when still there)."""
    from reflact.analysis.records import saved_hydra
    from reflact.tracking.process import RunContext

    cfg, params = _saved_config(rd, launch_dir, tracking_uri)
    hydra_yaml = rd / HYDRA / "hydra.yaml"
    multirun, overrides, job = saved_hydra(hydra_yaml) if hydra_yaml.is_file() else (False, (), None)
    sweep_dir = _sweep_dir(rd.root) if multirun else None
    dataset, system = _inputs(cfg)
    return RunContext(
        data=cfg.data,
        reflect=cfg.reflect,
        prompts=cfg.prompts,
        optimizer=cfg.optimizer,
        mlflow=cfg.mlflow,
        params=params,
        run_dir=rd,
        launch_dir=launch_dir,
        started_at=float(summary.get("times", {}).get("started_at", time.time())),
        dataset=dataset,
        system=system,
        overrides=overrides,
        sweep_dir=sweep_dir,
        job=job,
        template_hashes=summary["settings"].get("template_hashes"),
    )


def _saved_config(rd: RunDir, launch_dir: Path, tracking_uri: str | None):
    """(the run's config, its params) as saved, its store `tracking_uri` or else its own."""
    from reflact import config
    from reflact.analysis.records import saved_config
    from reflact.tracking.store import tracking_uri as default_uri

    config.register()
    cfg, params = config.from_hydra(saved_config(rd / HYDRA / "config.yaml"))
    cfg.mlflow.tracking_uri = tracking_uri or default_uri(cfg.mlflow, launch_dir)
    return cfg, params


def relog_sweep(sweep_dir: Path, launch_dir: Path, tracking_uri: str | None) -> tuple[str | None, int]:
    """Logs what MLflow lacks of a sweep: its parent run (made again when the store lacks it), each
    job whose MLflow run is not wholly there, then the parent's status, counts and report from the
    job dirs. Returns (the parent's id, or None when the store failed, with a warning; how many
    jobs could not be logged)."""
    from reflact.core.text import one_line
    from reflact.sweeps.grid_report import report_sweep
    from reflact.sweeps.jobs import sweep_jobs
    from reflact.sweeps.sweep import listed, open_parent, status_of_children
    from reflact.tracking.store import Store, now_ms

    sweep = SweepDir(sweep_dir.resolve())
    summarised = sweep.runs()
    if not summarised:
        raise UserError(f"{sweep_dir}: no job of this sweep got as far as its summary; nothing to log")
    cfg, _ = _saved_config(summarised[0], launch_dir, tracking_uri)
    uri, identity = str(cfg.mlflow.tracking_uri), sweep.identity()
    try:
        store = Store(uri, cfg.mlflow.experiment, launch_dir)
        open_parent(
            store, sweep, launch_dir, cfg.name, {**identity.get("fixed", {}), **listed(identity.get("swept", {}))}
        )
        failures = sum(not _relog_job(job, store, launch_dir) for job in sweep_jobs(sweep, store.uri))
        report_sweep(store.client, sweep.parent_record()["sweep_id"], sweep.report, store.run_id)
        jobs = sweep_jobs(sweep, store.uri)
        store.end(status_of_children(store, jobs, sweep, failed=bool(sweep.failed_jobs())), now_ms())
    except UserError:  # a store no retry opens (half-migrated): what to do, in one line
        raise
    except Exception as exc:  # the store's failure, in one line
        log.warning("MLflow logging to %s failed: %s", uri, one_line(exc))
        return None, len(summarised)
    return store.run_id, failures


def _relog_job(job, store, launch_dir: Path) -> bool:
    """A job of the sweep in `store` under its parent: relogged when MLflow lacks some of it, else
    attached to the parent (one made again since it ran); whether that went."""
    if not job.missing:
        run_id = RunDir(job.run_dir).mlflow_record().get("run_id")
        if isinstance(run_id, str) and run_id:
            with contextlib.suppress(Exception):  # a job whose run was deleted: nothing to attach
                store.client.set_tag(run_id, "mlflow.parentRunId", store.run_id)
        return True
    try:
        return relog(job.run_dir, launch_dir, store.uri) is not None
    except UserError as exc:  # a damaged job dir: the others are still logged
        log.warning("%s", exc)
        return False


def _sweep_dir(job_dir: Path) -> Path | None:
    """The sweep a job dir belongs to: the nearest folder above it holding Hydra's multirun.yaml
    (its saved hydra.sweep.dir may hold interpolations that only resolve inside Hydra)."""
    for folder in job_dir.parents:
        if (folder / "multirun.yaml").is_file() or SweepDir(folder).parent_record():
            return folder
    log.info("%s: no multirun.yaml above it; logged as a run of its own", job_dir)
    return None


def _inputs(cfg):
    """(dataset, system prompts) as the run had them, or None for what is no longer there."""
    from reflact.core.modes import get_mode
    from reflact.inputs.dataset import load_dataset
    from reflact.prompting.prompts import overrides_of, resolve_system_prompts

    try:
        dataset = load_dataset(cfg.data, cfg.mlflow.tracking_uri)  # _saved_config set the store
    except UserError as exc:
        log.info("the dataset is not logged as an input: %s", exc)
        dataset = None
    try:
        system = resolve_system_prompts(overrides_of(cfg.prompts), get_mode(cfg.reflect.update_mode), cfg.reflect)
    except UserError as exc:
        log.info("the templates are not linked: %s", exc)
        system = None
    return dataset, system


def _outcomes(summary: dict, o: OptimizerConfig, rd: RunDir) -> list:
    """The minibatches' records as the stage's outcomes; what the MLflow run needs of them beyond
    what loggable_summary checks (a cost, for a priced model) is checked too."""
    from reflact.calls.protocol import Usage
    from reflact.config import priced
    from reflact.running.outcome import Outcome

    names = {f.name for f in fields(Outcome)}
    outcomes = []
    for number, record in enumerate(summary["minibatches"]):
        missing = [key for key in ("cost_usd", "spent_usd") if record.get(key, 0.0) is None]
        if missing and priced(o):
            where = f"{rd / SUMMARY}: minibatches[{number}].{missing[0]}"
            raise UserError(f"{where} is damaged (null for a priced model)")
        kept = {k: v for k, v in record.items() if k in names}
        outcomes.append(Outcome(**{**kept, "usage": Usage(**record["usage"])}))
    return outcomes


def _events(rd: RunDir, summary: dict, outcomes: list) -> list:
    from reflact.prompting.plan import Minibatch, parse_tag
    from reflact.running.events import MinibatchEnded, Planned

    plan = [  # loggable_summary checked that each tag is its group's and index's
        Minibatch(record["group"], record["index"], [], (parse_tag(record["tag"]) or ("", 0, 0))[2])
        for record in summary["minibatches"]
    ]
    return [Planned(plan), *(MinibatchEnded(o, rd.patch(o.tag)) for o in outcomes)]


@exits_on_user_error
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Log a finished run dir, or a sweep dir, into MLflow again.")
    parser.add_argument("run_dir", type=Path, help="a run dir, or a sweep dir (its jobs and its parent run)")
    parser.add_argument("--tracking-uri", default=None, help="default: the run's own mlflow.tracking_uri")
    args = parser.parse_args(argv)
    own_lines_shown()
    if SweepDir(args.run_dir).is_sweep():
        parent, failures = relog_sweep(args.run_dir, Path.cwd(), args.tracking_uri)
        if parent is not None:
            print(f"logged sweep {args.run_dir} under MLflow parent run {parent}")
        return 1 if parent is None or failures else 0
    run_id = relog(args.run_dir, Path.cwd(), args.tracking_uri)
    if run_id is None:
        return 1
    print(f"logged {args.run_dir} as MLflow run {run_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
