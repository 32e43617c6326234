"""Log a finished run dir into MLflow again, e.g. after the tracking store was unreachable:

    python -m reflact.relog RUN_DIR [--tracking-uri URI]

Run it from the directory the run was started from (the default store is outputs/mlflow.db
there). Nothing is called and nothing in the run dir changes but its record of the MLflow run.
The run is written by the same code as live tracking, from the run dir's records, so it holds
the same names and values, every request's trace included (from the run dir's traces.jsonl). A
job of a sweep is attached to the sweep's parent run again when that run is in the same store.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import fields
from pathlib import Path

from reflact.errors import UserError, exits_on_user_error, own_lines_shown
from reflact.running.rundir import HYDRA, SUMMARY, RunDir, SweepDir, TraceRecords, recorded_requests

log = logging.getLogger("reflact")


def relog(run_dir: Path, launch_dir: Path, tracking_uri: str | None) -> str | None:
    """Logs the run dir as a new MLflow run (replacing the one it had); returns its id, or None
    (with a warning) when tracking failed."""
    from reflact.analysis.records import finished_summary
    from reflact.running.summary import run_status
    from reflact.text import one_line
    from reflact.tracking.mirror import Mirror
    from reflact.tracking.store import Store, mlflow_globals_at

    rd = RunDir(run_dir.resolve())
    if rd.summary() is None or not (rd / HYDRA / "config.yaml").is_file():
        raise UserError(f"{run_dir}: not a finished run dir ({SUMMARY} and {HYDRA}/config.yaml are needed)")
    summary = finished_summary(rd.root)  # the shape the stage writes, or one line naming the damage
    context = _context(rd, launch_dir, tracking_uri, summary)
    outcomes = _outcomes(summary)
    status, _ = run_status(summary["counts"], context.cfg, outcomes, rd.root)
    uri = context.cfg.mlflow.tracking_uri
    try:
        with mlflow_globals_at(uri):
            mirror = Mirror(Store(uri, context.cfg.mlflow.experiment, launch_dir), context)
            run_id = mirror.open()
            mirror.write(_events(rd, summary, outcomes))
            if context.cfg.mlflow.trace_calls:
                mirror.store.traces(recorded_requests(TraceRecords(rd).of()), context.cfg.optimizer.model)
            mirror.end(summary, status, int(summary.get("times", {}).get("ended_at", time.time()) * 1000))
    except Exception as exc:  # the store's failure, in one line
        log.warning("MLflow logging to %s failed: %s", uri, one_line(exc))
        return None
    rd.write_mlflow_record({"run_id": run_id, "tracking_uri": uri, "status": status})
    return run_id


def _context(rd: RunDir, launch_dir: Path, tracking_uri: str | None, summary: dict):
    """The run's context from its saved config (its dataset and templates when still there)."""
    from reflact import config
    from reflact.analysis.records import saved_yaml
    from reflact.tracking.process import RunContext
    from reflact.tracking.store import tracking_uri as default_uri

    config.register()
    cfg, params = config.from_hydra(saved_yaml(rd / HYDRA / "config.yaml"))
    cfg.mlflow.tracking_uri = tracking_uri or default_uri(cfg, launch_dir)
    hydra_yaml = rd / HYDRA / "hydra.yaml"
    hc = saved_yaml(hydra_yaml).hydra if hydra_yaml.is_file() else None
    multirun = hc is not None and str(hc.mode) == "MULTIRUN"
    sweep_dir = _sweep_dir(rd.root) if multirun else None
    dataset, system = _inputs(cfg)
    return RunContext(
        cfg=cfg,
        params=params,
        run_dir=rd,
        launch_dir=launch_dir,
        started_at=float(summary.get("times", {}).get("started_at", time.time())),
        dataset=dataset,
        system=system,
        overrides=tuple(hc.overrides.task) if hc is not None else (),
        sweep_dir=sweep_dir,
        job=int(hc.job.num) if hc is not None and multirun else None,
        template_hashes=summary["settings"].get("template_hashes"),
    )


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
    from reflact.inputs.dataset import load_dataset
    from reflact.modes import get_mode
    from reflact.prompting.prompts import overrides_of, resolve_system_prompts

    try:
        dataset = load_dataset(cfg.data)
    except UserError as exc:
        log.info("the dataset is not logged as an input: %s", exc)
        dataset = None
    try:
        system = resolve_system_prompts(overrides_of(cfg.prompts), get_mode(cfg.reflect.update_mode), cfg.reflect)
    except UserError as exc:
        log.info("the templates are not linked: %s", exc)
        system = None
    return dataset, system


def _outcomes(summary: dict) -> list:
    from reflact.calls.protocol import Usage
    from reflact.running.outcome import Outcome

    names = {f.name for f in fields(Outcome)}
    outcomes = []
    for record in summary["minibatches"]:
        kept = {k: v for k, v in record.items() if k in names}
        outcomes.append(Outcome(**{**kept, "usage": Usage(**record.get("usage", {}))}))
    return outcomes


def _events(rd: RunDir, summary: dict, outcomes: list) -> list:
    from reflact.prompting.plan import Minibatch, parse_tag
    from reflact.running.events import MinibatchEnded, Planned

    plan = [
        Minibatch(record["group"], record["index"], [], (parse_tag(record["tag"]) or ("", 0, 0))[2])
        for record in summary["minibatches"]
    ]
    return [Planned(plan), *(MinibatchEnded(o, rd.patch(o.tag)) for o in outcomes)]


@exits_on_user_error
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Log a finished run dir into MLflow again.")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--tracking-uri", default=None, help="default: the run's own mlflow.tracking_uri")
    args = parser.parse_args(argv)
    own_lines_shown()
    run_id = relog(args.run_dir, Path.cwd(), args.tracking_uri)
    if run_id is None:
        return 1
    print(f"logged {args.run_dir} as MLflow run {run_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
