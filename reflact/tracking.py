"""Logging a finished run dir to MLflow: params, metrics, per-minibatch series, artifacts.

It reads only what the stage already wrote locally, so a tracking failure never costs a
paid-for reply: the run dir stays complete and the run ends with a warning.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from reflact.config import ReflactConfig
from reflact.files import read_json, write_json
from reflact.modes import get_mode
from reflact.rundir import MLFLOW_RUN, RunDir
from reflact.summary import apply_metrics

log = logging.getLogger("reflact")

PARENT_FILE = "mlflow_parent.json"  # in a sweep dir: the sweep's parent run
MINIBATCH_METRICS = ("analysed", "skipped", "proposed", "kept", "truncated", "calls", "failed_calls", "reasks",
                     "retries", "cache_hits", "parts", "shortened", "cost_usd", "spent_usd", "latency_s")


def default_tracking_uri(launch_dir: Path) -> str:
    return f"sqlite:///{(launch_dir / 'outputs' / 'mlflow.db').resolve()}"


def run_metrics(summary: dict) -> dict[str, float]:
    s = summary["settings"]
    metrics = {
        "M": s["minibatch_size"],
        "L": s["edit_budget"],
        "seed": s["seed"],
        "mode": get_mode(s["update_mode"]).number,  # 0 patch, 1 rewrite, 2 full rewrite
    }
    metrics.update({k: float(v) for k, v in summary["counts"].items()})
    return metrics


def minibatch_series(summary: dict) -> list[tuple[str, float, int]]:
    """(key, value, step) for every minibatch, step = its position in the run's order."""
    rows = []
    for step, mb in enumerate(summary["minibatches"]):
        for key in MINIBATCH_METRICS:
            rows.append((f"minibatch/{key}", float(mb[key]), step))
        for key, value in mb["usage"].items():
            rows.append((f"minibatch/tokens_{key}", float(value), step))
        for key, value in apply_metrics(mb.get("apply", {})).items():
            rows.append((f"minibatch/{key}", float(value), step))
    return rows


def tracking_uri(cfg: ReflactConfig, launch_dir: Path) -> str:
    return cfg.mlflow.tracking_uri or default_tracking_uri(launch_dir)


def experiment_id(client, name: str, uri: str, launch_dir: Path) -> str:
    """The experiment's id, created on first use (which also migrates a fresh sqlite store)."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    # a local sqlite store keeps its artifacts beside it under outputs/, not in ./mlruns
    location = (launch_dir / "outputs" / "mlartifacts").resolve().as_uri() if uri.startswith("sqlite:") else None
    return client.create_experiment(name, artifact_location=location)


def sweep_id(sweep_dir: Path, launch_dir: Path) -> str:
    """Names a sweep in tags: its folder, relative to where it was started when possible."""
    try:
        return str(sweep_dir.resolve().relative_to(launch_dir.resolve()))
    except ValueError:
        return str(sweep_dir.resolve())


def log_run(
    cfg: ReflactConfig, params: dict[str, str], summary: dict, run_dir: Path, launch_dir: Path, sweep_dir: Path | None = None
) -> str | None:
    """Log the run; returns its MLflow run id, or None (with a warning) when tracking failed.

    A run dir logged before (a rerun) replaces its earlier MLflow run, which is deleted, so
    a resumed run or sweep shows each run dir once. In a sweep the run is a child of the
    sweep's parent run and carries the sweep id as a tag either way.
    """
    uri = tracking_uri(cfg, launch_dir)
    # MLflow's default (7 retries with backoff) would hold a finished run for minutes when the
    # server is down; the outputs are safe on disk, so give up sooner (unless the user set it)
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    try:
        return _log(uri, cfg, params, summary, run_dir, launch_dir, sweep_dir)
    except Exception as exc:  # noqa: BLE001 - tracking must never lose the local results
        log.warning(
            "MLflow logging to %s failed (%s): nothing of this run was logged there. Its outputs are complete "
            "in %s; log them later with: python -m reflact.relog %s", uri, _one_line(exc), run_dir, run_dir,
        )
        return None


def _log(uri: str, cfg: ReflactConfig, params: dict[str, str], summary: dict, run_dir: Path, launch_dir: Path,
         sweep_dir: Path | None) -> str:
    import mlflow
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp_id = experiment_id(client, cfg.mlflow.experiment, uri, launch_dir)
    tags = {"reflact.run_dir": str(run_dir)}
    run_name = run_dir.name
    if sweep_dir is not None:
        tags["reflact.sweep_id"] = sweep_id(sweep_dir, launch_dir)
        parent = read_json(sweep_dir / PARENT_FILE)
        if isinstance(parent, dict) and parent.get("tracking_uri") == uri:
            tags["mlflow.parentRunId"] = parent["run_id"]
        else:
            log.warning("no MLflow parent run for sweep %s; the run is tagged reflact.sweep_id instead",
                        tags["reflact.sweep_id"])
    earlier = read_json(run_dir / MLFLOW_RUN)
    run = client.create_run(exp_id, run_name=run_name, tags=tags)
    run_id = run.info.run_id
    write_json(run_dir / MLFLOW_RUN, {"run_id": run_id, "tracking_uri": uri})
    if isinstance(earlier, dict) and earlier.get("tracking_uri") == uri:
        _delete(client, earlier["run_id"])
    status = "FAILED"
    try:
        items = [Param(k, v) for k, v in params.items()]
        items += [Param(f"template_hash.{g}", h) for g, h in summary["settings"]["template_hashes"].items()]
        for start in range(0, len(items), 100):
            client.log_batch(run_id, params=items[start : start + 100])
        now = int(mlflow.utils.time.get_current_time_millis())
        metrics = [Metric(k, v, now, 0) for k, v in run_metrics(summary).items()]
        metrics += [Metric(k, v, now, step) for k, v, step in minibatch_series(summary)]
        for start in range(0, len(metrics), 1000):
            client.log_batch(run_id, metrics=metrics[start : start + 1000])
        rd = RunDir(run_dir)
        for folder in (rd.patches, rd.calls, rd.preview):
            if folder.is_dir():
                client.log_artifacts(run_id, str(folder), folder.name)
        for path, folder in rd.artifact_files():
            client.log_artifact(run_id, str(path), folder)
        rows = list(rd.kept_items())
        if rows:
            client.log_table(run_id, _kept_table(rows), "kept_items.json")
        if cfg.mlflow.trace_calls:
            mlflow.set_tracking_uri(uri)  # the trace exporter writes to the global tracking store
            _log_traces(client, exp_id, run_id, summary, rd)
        status = "FINISHED"
    finally:
        client.set_terminated(run_id, status)
    return run_id


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:299] + "…"


def _delete(client, run_id: str) -> None:
    try:
        client.delete_run(run_id)
    except Exception:  # noqa: BLE001 - already gone: nothing to replace
        pass


def _kept_table(rows: list[dict]) -> dict[str, list]:
    return {
        "minibatch": [r["minibatch"] for r in rows],
        "position": [r["position"] for r in rows],
        "trajectory_ids": [", ".join(r["trajectory_ids"]) for r in rows],
        "item": [json.dumps(r["item"], ensure_ascii=False) for r in rows],
        "apply_status": [r.get("apply", {}).get("status", "") for r in rows],
    }


def _log_traces(client, experiment_id: str, run_id: str, summary: dict, run_dir: RunDir) -> None:
    """One trace per optimizer call (prompt, reply, tokens), rebuilt from the run dir after the
    stage, so tracing adds nothing to the calls' path."""
    import mlflow

    for mb in summary["minibatches"]:
        if not mb["call_log"]:
            continue
        system = run_dir.read_text(run_dir.system_path(mb["tag"]))
        user = run_dir.read_text(run_dir.user_path(mb["tag"], 1))
        for attempt, call in enumerate(mb["call_log"], 1):
            if "error" in call:
                continue
            start_ns = int(call["started_at"] * 1e9)
            span = client.start_trace(
                name=mb["tag"], span_type="LLM", experiment_id=experiment_id, run_id=run_id,
                inputs={"system": system, "user": user, "attempt": attempt, "messages": call["messages"]},
                attributes={"max_output_tokens": call["max_output_tokens"], "from_cache": call["from_cache"]},
                start_time_ns=start_ns,
            )
            client.end_trace(
                span.trace_id,
                outputs={"reply": run_dir.read_text(run_dir.reply_path(mb["tag"], attempt)),
                         "finish_reason": call["finish_reason"]},
                attributes={f"tokens_{k}": v for k, v in call["usage"].items()},
                end_time_ns=start_ns + int(call["latency_s"] * 1e9),
            )
    flush = getattr(mlflow, "flush_trace_async_logging", None)
    if flush:
        flush()
