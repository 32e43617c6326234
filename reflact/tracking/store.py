"""What a run looks like in MLflow: its name, tags, params, metrics, dataset, prompts, artifacts and
traces, and the store they are written to. Used live, as the run goes (reflact.tracking.live), and by
`python -m reflact.relog` for a finished run dir; both write the same names and values.

mlflow is imported only inside `Store` (it takes ~1.6 s): the live tracker opens the store on its
own thread while the first calls are in flight.
"""

from __future__ import annotations

import base64
import contextlib
import getpass
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import time
from dataclasses import asdict
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlparse

import reflact
from reflact.config import MlflowConfig, OptimizerConfig, ReflectConfig
from reflact.core.files import write_text
from reflact.core.imports import one_at_a_time
from reflact.core.launch import LaunchDir
from reflact.core.modes import get_mode
from reflact.tracking.sqlite import first_use, opening_failed

log = logging.getLogger("reflact")

# per-minibatch series (step = the minibatch's position in the plan); the rest of its record is
# in its outcome.json artifact: fewer rows keep large runs fast to log and to chart
SERIES = ("proposed", "kept", "reasks", "retries", "cost_usd", "latency_s")
SERIES_TOKENS = ("prompt", "completion")
# what a dry run only estimates, logged under names of their own
ESTIMATED = ("cost_usd", "tokens_prompt", "tokens_completion", "tokens_cached", "tokens_reasoning")
# run metrics from the run's analysis.json (reflact.analysis.figures), when it has them
ANALYSIS_METRICS = (
    "agreement",
    "redundancy",
    "distinct_edits",
    "distinct_edits_per_usd",
    "analysis_tokens",
    "analysis_cost_usd",
)
# the outcome a run's compare view opens on, logged (0 before any minibatch) ahead of the settings:
# MLflow's compare view opens its parallel coordinates plot on the first metric its runs share, in
# the order the store returns them (the order they were first logged), against the params that differ
OPENING_METRIC = "edits_kept"
METRICS_PER_WRITE = 1000  # the most metrics MLflow takes in one request
TRACE_BATCH = 100  # traces per write: the most MLflow links to a run in one request
PAGE = 1000  # runs per search request


def default_tracking_uri(launch_dir: Path) -> str:
    return LaunchDir(launch_dir).mlflow_uri


def tracking_uri(m: MlflowConfig, launch_dir: Path) -> str:
    return m.tracking_uri or default_tracking_uri(launch_dir)


def run_name(r: ReflectConfig, o: OptimizerConfig, job: int | None = None) -> str:
    """What tells runs apart at a glance: `patch M8 L4 s42`, `#3` for a sweep's job, `dry run`."""
    name = f"{get_mode(r.update_mode).short} M{r.minibatch_size} L{r.edit_budget} s{r.seed}"
    name += f" k{o.samples}" if o.samples > 1 else ""
    name += f" #{job}" if job is not None else ""
    return name + (" dry run" if o.dry_run else "")


def setting_metrics(r: ReflectConfig, o: OptimizerConfig) -> dict[str, int]:
    """M, L, seed and mode as metrics too, so charts and the compare view can use them as axes."""
    metrics = {"M": r.minibatch_size, "L": r.edit_budget, "seed": r.seed, "mode": get_mode(r.update_mode).number}
    if o.samples > 1:  # draws per minibatch; absent: one
        metrics["samples"] = o.samples
    return metrics


def total_metrics(counts: dict, dry_run: bool) -> dict[str, float]:
    """Run counts as metrics; a dry run's tokens and cost are estimates and say so in their names."""
    metrics = {}
    for key, value in counts.items():
        if value is None:  # a cost without a price: unknown, left out rather than logged as 0
            continue
        if dry_run and key in ESTIMATED:
            key = f"estimated_{key}"
        elif dry_run and key == "spent_usd":
            continue
        metrics[key] = float(value)
    return metrics


def analysis_metrics(analysis: dict) -> dict[str, float]:
    """The run's analysis figures as metrics; one that is not defined (agreement with one draw,
    items per dollar of an unpriced run) is left out rather than logged as a number."""
    return {key: float(analysis[key]) for key in ANALYSIS_METRICS if isinstance(analysis.get(key), (int, float))}


def minibatch_metrics(record: dict) -> dict[str, float]:
    """One minibatch's series values from its record (reflact.running.outcome.Outcome as a dict)."""
    metrics = {f"minibatch/{key}": float(record[key]) for key in SERIES if record.get(key) is not None}
    metrics.update({f"minibatch/tokens_{key}": float(record["usage"][key]) for key in SERIES_TOKENS})
    if record.get("apply"):
        metrics["minibatch/apply_share"] = float(record["apply"]["apply_share"])
    return metrics


def context_tags(dry_run: bool, run_dir: Path, launch_dir: Path, overrides: list[str]) -> dict[str, str]:
    """MLflow's standard context tags, and reflact's own."""
    tags = {
        "mlflow.user": _user(),
        "mlflow.source.type": "LOCAL",
        "mlflow.source.name": "reflact",
        "reflact.version": reflact.__version__,
        "reflact.run_dir": str(run_dir),
        "reflact.overrides": " ".join(overrides),
        "reflact.dry_run": str(dry_run).lower(),
    }
    commit = git_commit(launch_dir)
    if commit:
        tags["mlflow.source.git.commit"] = commit
    return tags


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (containers)
        return str(os.getuid())


def git_commit(folder: Path) -> str | None:
    """The commit checked out where the run was launched, when that is a git checkout."""
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def dataset_digest(skill_path: Path, results_path: Path, conversations: list[Path]) -> str:
    """A digest of the dataset's contents: the skill, the results file and every conversation."""
    digest = hashlib.sha256()
    for path in (skill_path, results_path, *conversations):
        digest.update(path.name.encode("utf-8") + b"\0")
        if path.is_file():
            with open(path, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()[:16]


def prompt_name(group: str, mode: str, skill_aware: bool, overridden: bool, provenance: bool = False) -> str:
    """The prompt registry's name of a system prompt: a new version only when its text changes."""
    name = f"reflact.{group}.{get_mode(mode).short}"
    name += (".skill_aware" if skill_aware else "") + (".provenance" if provenance else "")
    return name + (".custom" if overridden else "")


class Store:
    """One MLflow tracking store, and the run being written to it. Every method may raise: the
    callers (live tracking, relog) turn a failure into a warning and the run dir stays complete."""

    def __init__(self, uri: str, experiment: str, launch_dir: Path) -> None:
        mlflow_defaults()
        with one_at_a_time():
            from mlflow.tracing.client import TracingClient
            from mlflow.tracking import MlflowClient

        self.uri = uri
        with first_use(uri):  # a fresh local store is migrated first
            try:
                self.client = MlflowClient(tracking_uri=uri, registry_uri=uri)
                self._tracing = TracingClient(uri)
                self.experiment_id = experiment_id(self.client, experiment, uri, launch_dir)
            except Exception as exc:
                opening_failed(uri, exc)  # a half-migrated store, in one line
                raise
        self.run_id = ""
        self._artifact_dir: Path | None = None
        # traces went through MLflow's tracer, whose failed exports it only logs: to be checked
        self.tracer_used = False

    def retire(self, run_dir: Path, keep: str = "") -> None:
        """Ends and deletes every active run logged for `run_dir` before but `keep` (a rerun replaces its
        run, whatever moment the earlier process died at): one run dir, one active MLflow run."""
        runs, _ = runs_tagged(self.client, [self.experiment_id], "reflact.run_dir", str(run_dir))
        for run in (run for run in runs if run.info.run_id != keep):
            if run.info.status == "RUNNING":
                self.client.set_terminated(run.info.run_id, "KILLED")
            self.client.delete_run(run.info.run_id)

    def create(self, name: str, tags: dict[str, str], start_ms: int) -> str:
        run = self.client.create_run(self.experiment_id, start_time=start_ms, tags=tags, run_name=name)
        self.run_id = run.info.run_id
        self._artifact_dir = _local_dir(run.info.artifact_uri)
        return self.run_id

    def log_params(self, params: dict[str, str]) -> None:
        with one_at_a_time():
            from mlflow.entities import Param

        items = [Param(k, v) for k, v in params.items()]
        for start in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[start : start + 100], synchronous=True)

    def log_metrics(self, rows: list[tuple[str, float, int]], timestamp_ms: int, tags: dict | None = None) -> None:
        """Metrics (key, value, step), and `tags` with the first of them: one request per METRICS_PER_WRITE."""
        with one_at_a_time():
            from mlflow.entities import Metric, RunTag

        metrics = [Metric(key, value, timestamp_ms, step) for key, value, step in rows]
        run_tags = [RunTag(key, value) for key, value in (tags or {}).items()]
        for start in range(0, len(metrics) or len(run_tags), METRICS_PER_WRITE):
            self.client.log_batch(
                self.run_id, metrics=metrics[start : start + METRICS_PER_WRITE], tags=run_tags if not start else []
            )

    def log_files(self, files: list[tuple[Path, str]]) -> None:
        """(file, artifact folder) pairs. A local artifact store gets hard links where it can: the
        run dir already holds the bytes, and its files are only ever replaced, never rewritten.
        Whatever the pairs say, nothing is written outside the run's artifacts, and a target that
        is its source already is left alone (unlinking it would delete the source)."""
        for path, folder in files:
            if not path.is_file():
                continue
            if not _artifact_folder(folder):
                log.warning("%s is not logged: the artifact folder %r leads out of the run's artifacts", path, folder)
                continue
            if self._artifact_dir is None:
                self.client.log_artifact(self.run_id, str(path), folder)
                continue
            target = self._artifact_dir / folder / path.name
            if not target.resolve().is_relative_to(self._artifact_dir.resolve()):
                log.warning("%s is not logged: %s leads out of the run's artifacts", path, target)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists() and os.path.samefile(path, target):
                continue  # this very file already (the source itself, or a link logged before)
            target.unlink(missing_ok=True)
            try:
                os.link(path, target)
            except OSError:  # another file system, or links not allowed
                shutil.copyfile(path, target)

    def log_table(self, table: dict[str, list], name: str) -> dict[str, str]:
        """`table` as the artifact `name` (table_json); returns the run tag listing it, for the next write."""
        if self._artifact_dir is None:
            self.client.log_text(self.run_id, table_json(table), name)
        else:
            write_text(self._artifact_dir / name, table_json(table))
        return table_tag(name)

    def log_dataset(self, name: str, digest: str, source: str | dict, profile: dict, kind: str = "local") -> None:
        with one_at_a_time():
            from mlflow.entities import Dataset, DatasetInput, InputTag

        dataset = Dataset(
            name=name,
            digest=digest,
            source_type=kind,  # a folder's URI is its source; traces name their store, experiment, filter
            source=json.dumps(source if isinstance(source, dict) else {"uri": source}),
            profile=json.dumps(profile),
        )
        inputs = [DatasetInput(dataset, [InputTag("mlflow.data.context", "reflect")])]
        # Jobs of a sweep log the same dataset at once: the store's insert of the loser of that race
        # fails on the unique key and is rolled back; asked again, the store finds the winner's row.
        for attempt in range(3):
            try:
                self.client.log_inputs(self.run_id, inputs)
                return
            except Exception:
                if attempt == 2:
                    raise
                time.sleep(0.05 * (attempt + 1))

    def link_prompt(self, name: str, text: str, template_hash: str) -> None:
        """Registers `text` under `name` unless its latest version holds it already; links it to the run.
        Jobs of a sweep may register the same prompt at once: the loser of that race finds the winner's."""
        for attempt in range(3):
            version = self._latest_prompt(name)
            if version is not None and version.template == text:
                break
            try:
                version = self.client.register_prompt(
                    name=name,
                    template=text,
                    tags={"reflact.template_hash": template_hash},
                    commit_message=f"hash {template_hash}",
                )
                break
            except Exception:  # registered meanwhile by another job: look again
                if attempt == 2:
                    raise
        self.client.link_prompt_version_to_run(self.run_id, version)

    def _latest_prompt(self, name: str):
        try:
            return self.client.load_prompt(f"prompts:/{name}@latest")
        except Exception:  # not registered yet
            return None

    def traces(self, events: list, model: str) -> None:
        """Requests as MLflow traces linked to the run (log_traces)."""
        self.tracer_used |= log_traces(self.client, self._tracing, self.experiment_id, self.run_id, events, model)

    def end(self, status: str, end_ms: int) -> None:
        self.client.set_terminated(self.run_id, status, end_time=end_ms)


def end_run(store: Store, status: str, end_ms: int) -> None:
    """Ends the run with `status`; one SCHEDULED (its batch left to run: reflact.running.batch) has
    no end yet, and is taken up again by the command that goes on (`resume`)."""
    if status == "SCHEDULED":
        store.client.update_run(store.run_id, status="SCHEDULED")
    else:
        store.end(status, end_ms)


def resume(store: Store, run_id: str) -> set[str]:
    """Takes up a run left SCHEDULED, RUNNING again; returns the names of the params it holds."""
    run = store.client.get_run(run_id)
    store.run_id = run_id
    store._artifact_dir = _local_dir(run.info.artifact_uri)
    store.client.update_run(run_id, status="RUNNING")
    return set(run.data.params)


def batch_view(notes: list[dict]) -> tuple[dict[str, str], dict[str, float]]:
    """A run's batches as MLflow shows them: their ids (a tag), each one's status, times, counts and
    usage (a tag each), and the request counts and tokens over them (metrics)."""
    ids = [str(note["id"]) for note in notes if note.get("id")]
    tags = {"reflact.batches": ",".join(ids)} if ids else {}
    metrics = {"batch_requests_total": 0.0, "batch_requests_completed": 0.0, "batch_requests_failed": 0.0}
    for note in notes:
        if not note.get("id"):
            continue
        key = re.sub(r"[^A-Za-z0-9_.-]", "_", str(note["id"]))[:200]
        shown = {"status": note.get("status"), **note.get("counts", {}), **note.get("times", {})}
        tags[f"reflact.batch.{key}"] = json.dumps({**shown, "usage": note.get("usage", {})})[:5000]
        for name in ("total", "completed", "failed"):
            metrics[f"batch_requests_{name}"] += float(note.get("counts", {}).get(name, 0))
        for name, value in note.get("usage", {}).items():
            if name in ("input_tokens", "output_tokens", "total_tokens"):
                metrics[f"batch_{name}"] = metrics.get(f"batch_{name}", 0.0) + float(value)
    return tags, metrics


def traced_requests(store: Store) -> set[tuple[str, str]]:
    """(minibatch, request number) of every trace the store holds for its run."""
    found: set[tuple[str, str]] = set()
    token = None
    while True:
        page = store.client.search_traces(
            locations=[store.experiment_id],
            run_id=store.run_id,
            max_results=500,
            page_token=token,
            include_spans=False,
        )
        found.update((t.info.tags.get("reflact.minibatch", ""), t.info.tags.get("reflact.request", "")) for t in page)
        token = page.token
        if not token:
            return found


def table_json(table: dict[str, list]) -> str:
    """A table (column -> values) laid out as MLflow's log_table writes it: pandas' "split" JSON,
    what mlflow.load_table and the UI's table view read. log_table itself also reads the whole run
    three times to add the table to those logged before (~40 ms at the end of a run): a run reflact
    logs has no other, so Store.log_table writes the file and its tag (table_tag) alone."""
    rows = [list(row) for row in zip(*table.values(), strict=True)]
    return json.dumps({"columns": list(table), "data": rows}, ensure_ascii=False)


def table_tag(name: str) -> dict[str, str]:
    """The run tag that lists the table `name` (the only one of its run) for MLflow's UI."""
    with one_at_a_time():
        from mlflow.utils.mlflow_tags import MLFLOW_LOGGED_ARTIFACTS

    return {MLFLOW_LOGGED_ARTIFACTS: json.dumps([{"path": name, "type": "table"}])}


def log_traces(client, tracing, experiment_id: str, run_id: str, events: list, model: str) -> bool:
    """Requests as traces, TRACE_BATCH at a time: the exact messages, the reply or the error,
    tokens, latency, retries and whether the cache answered. A store that keeps no spans itself
    (a file store) gets them one at a time through MLflow's tracer; whether it did."""
    tracer_used = False
    for start in range(0, len(events), TRACE_BATCH):
        batch = events[start : start + TRACE_BATCH]
        try:
            spans = [trace_span(run_id, experiment_id, event, model) for event in batch]
            tracing.log_spans(experiment_id, spans)
        except NotImplementedError as exc:
            _unless_unanswered(exc)
            tracer_used = True
            for event in batch:
                write_trace(client, experiment_id, run_id, event, model)
            continue
        client.link_traces_to_run([span.trace_id for span in spans], run_id)
    return tracer_used


def _unless_unanswered(exc: NotImplementedError) -> None:
    """A server whose version MLflow could not look up (down, frozen) is a failure to retry, not a
    server without log_spans: MLflow would remember the failed look-up for the process and send every
    later trace through its tracer, one request each, whose failures it only logs."""
    if "could not identify" not in str(exc):
        return
    with one_at_a_time():
        from mlflow.store.tracking.rest_store import RestStore

    forget = getattr(RestStore._get_server_version, "cache_clear", None)
    if forget is not None:
        forget()
    raise ConnectionError(f"the tracking server did not tell its version ({exc})") from exc


def trace_span(run_id: str, experiment_id: str, event, model: str):
    """One request as the root span of a trace of its own, built as a finished span: written with
    other traces in one log_spans call (~5 ms a trace, where MLflow's tracer takes ~35 ms: a write
    for the span, another for the trace). Its ids follow from the run and the request, so a batch
    written again after a failure replaces its traces rather than adding copies."""
    with one_at_a_time():
        from mlflow.entities import Span

    digest = hashlib.sha256(f"{run_id}/{event.tag}/{event.number}".encode()).digest()
    reply = event.reply
    started = reply.started_at if reply is not None else event.ended_at
    ended = started + reply.latency_s if reply is not None else event.ended_at
    attributes = {
        "mlflow.traceRequestId": "tr-" + digest[:16].hex(),
        "mlflow.experimentId": experiment_id,
        "mlflow.spanType": "LLM",
        "mlflow.spanInputs": {"messages": event.messages},
        "mlflow.traceTag.mlflow.traceName": event.tag,
        "mlflow.traceTag.reflact.minibatch": event.tag,
        "mlflow.traceTag.reflact.request": str(event.number),
        "model": model,
        "request": event.number,
        **(_reply_attributes(event) if reply is not None else {"mlflow.spanOutputs": {"error": event.error}}),
    }
    return Span.from_dict(
        {
            "trace_id": base64.b64encode(digest[:16]).decode(),
            "span_id": base64.b64encode(digest[16:24]).decode(),
            "parent_span_id": None,
            "name": event.tag,
            "start_time_unix_nano": int(started * 1e9),
            "end_time_unix_nano": int(ended * 1e9),
            "status": {"code": "STATUS_CODE_OK" if reply is not None else "STATUS_CODE_ERROR", "message": ""},
            "attributes": {key: json.dumps(value, ensure_ascii=False) for key, value in attributes.items()},
        }
    )


def _reply_attributes(event) -> dict:
    reply = event.reply
    usage = asdict(reply.usage)
    return {
        "mlflow.spanOutputs": {"reply": reply.text},
        # MLflow's own token columns (the traces table shows them)
        "mlflow.chat.tokenUsage": {
            "input_tokens": usage["prompt"],
            "output_tokens": usage["completion"],
            "total_tokens": usage["prompt"] + usage["completion"],
        },
        **{f"tokens_{k}": v for k, v in usage.items()},
        "latency_s": round(reply.latency_s, 3),
        "retries": reply.retries,
        "from_cache": reply.from_cache,
        "finish_reason": reply.finish_reason or "",
        "structured_output": reply.structured,
        "cost_usd": event.cost_usd,
        **({"service_tier": reply.service_tier} if reply.service_tier else {}),
        **({"batch_id": reply.batch_id} if reply.batch_id else {}),
        **({"flex_unavailable": reply.flex_unavailable} if reply.flex_unavailable else {}),
    }


def write_trace(client, experiment_id: str, run_id: str, event, model: str) -> None:
    """One trace through MLflow's tracer (for a store without log_spans): the span opened with the
    request and ended with its reply or error, with trace_span's attributes."""
    reply = event.reply
    started = reply.started_at if reply is not None else event.ended_at
    span = client.start_trace(
        name=event.tag,
        span_type="LLM",
        inputs={"messages": event.messages},
        experiment_id=experiment_id,
        run_id=run_id,
        start_time_ns=int(started * 1e9),
        tags={"reflact.minibatch": event.tag, "reflact.request": str(event.number)},
        attributes={"model": model, "request": event.number},
    )
    if reply is None:
        client.end_trace(
            span.trace_id, outputs={"error": event.error}, status="ERROR", end_time_ns=int(event.ended_at * 1e9)
        )
        return
    attributes = _reply_attributes(event)
    client.end_trace(
        span.trace_id,
        outputs=attributes.pop("mlflow.spanOutputs"),
        attributes=attributes,
        end_time_ns=int((started + reply.latency_s) * 1e9),
    )


def mlflow_defaults() -> None:
    """reflact's defaults for MLflow's settings, read when mlflow is first imported (a user's own
    values win). Its default (7 retries with backoff) would hold a run for minutes when a tracking
    server is down; the outputs are safe on disk, so give up sooner. Its notes on migrating a fresh
    store are not the run's progress."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    # traces are written on reflact's own tracker thread already; MLflow's async queue would add
    # its own thread, polled once a second, that the end of every run had to wait for
    os.environ.setdefault("MLFLOW_ENABLE_ASYNC_TRACE_LOGGING", "false")
    # ending a run on a tracking server prints "View run ... at" and "View experiment at" (after
    # one more request for the run): reflact's output is its own lines, and it names the run itself
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")


@contextlib.contextmanager
def mlflow_globals_at(uri: str):
    """Traces and prompt links follow MLflow's global tracking URI: point it at the run's store
    while they are written, then restore what it was."""
    mlflow_defaults()
    with one_at_a_time():  # setting the URI resets MLflow's tracer, which loads parts of MLflow
        scope = _tracking_uri_scope(uri)
        scope.__enter__()
    try:
        yield
    finally:
        with one_at_a_time():
            scope.__exit__(None, None, None)


def _tracking_uri_scope(uri: str) -> contextlib.AbstractContextManager:
    try:
        with one_at_a_time():
            from mlflow.tracking._tracking_service.utils import _use_tracking_uri
    except ImportError:  # a later MLflow moved it: fall back to setting it (not restored)
        with one_at_a_time():
            import mlflow

        mlflow.set_tracking_uri(uri)
        return contextlib.nullcontext()
    return _use_tracking_uri(uri)


def experiment_id(client, name: str, uri: str, launch_dir: Path) -> str:
    """The experiment's id, created on first use (which also migrates a fresh sqlite store)."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    # a local sqlite store keeps its artifacts beside it under outputs/, not in ./mlruns
    location = LaunchDir(launch_dir).mlflow_artifacts.resolve().as_uri() if uri.startswith("sqlite:") else None
    try:  # the UI then opens on its runs table (model development), not on its GenAI views
        return client.create_experiment(
            name, artifact_location=location, tags={"mlflow.experimentKind": "custom_model_development"}
        )
    except Exception:  # created meanwhile by a parallel job of the same sweep: use that one
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def _artifact_folder(folder: str) -> bool:
    """A folder inside a run's artifacts: relative, and never climbing out of them."""
    path = PurePosixPath(folder)
    return not path.is_absolute() and ".." not in path.parts and "\\" not in folder


def _local_dir(artifact_uri: str) -> Path | None:
    parsed = urlparse(artifact_uri)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    return Path(artifact_uri) if parsed.scheme == "" else None


def runs_tagged(client, experiment_ids: list[str], key: str, value: str, also: str = "", page_token=None):
    """One page (PAGE) of the runs whose tag `key` is `value` and that meet the filter clause
    `also`: (those runs, the next page's token). A filter string has no escape for quotes, so the
    value goes inside the quote it does not hold (a path with an apostrophe, `o'brien`, in double
    quotes), and one holding both kinds is matched with LIKE, each apostrophe a one-character
    wildcard; the runs that only look alike are left out here."""
    if "'" not in value:
        clause = f"tags.`{key}` = '{value}'"
    elif '"' not in value:
        clause = f'tags.`{key}` = "{value}"'
    else:
        clause = f"tags.`{key}` LIKE '{value.replace(chr(39), '_')}'"
    page = client.search_runs(
        experiment_ids,
        filter_string=f"{clause} and {also}" if also else clause,
        max_results=1000,
        page_token=page_token,
    )
    return [run for run in page if run.data.tags.get(key) == value], page.token


def sweep_id(sweep_dir: Path, launch_dir: Path) -> str:
    """Names a sweep in tags: its folder, relative to where it was started when possible."""
    try:
        return str(sweep_dir.resolve().relative_to(launch_dir.resolve()))
    except ValueError:
        return str(sweep_dir.resolve())


def now_ms() -> int:
    """Now, as MLflow's timestamps count: milliseconds since the epoch."""
    return int(time.time() * 1000)
