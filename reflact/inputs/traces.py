"""Scored traces kept in MLflow as the run's input (data.source=mlflow), or as a dataset folder
(python -m reflact.import_traces).

Trace infos are searched a page at a time (MlflowClient.search_traces with page tokens, without
spans); a trace is selected when it carries the label's feedback and the value fits a pass rule,
the rest are counted as unlabelled, never guessed. Spans are fetched only for the selected traces,
in one request per page (MlflowClient.search_traces with spans asks for them ten traces at a time,
on threads). The store is asked again, as the tracker asks it, while it does not answer; a request
it refuses (a filter it cannot parse) is said at once.
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from reflact.config import DataConfig, MlflowConfig, TracesConfig
from reflact.core.errors import UserError
from reflact.core.imports import one_at_a_time
from reflact.core.text import one_line
from reflact.inputs.dataset import Dataset, Result, check_id, max_bytes_of, read_text
from reflact.inputs.importers import Imported, Run, check_output, write_dataset
from reflact.inputs.trace_mapping import Label, NoChat, label_of, span_views, trace_row

log = logging.getLogger("reflact")
PAGE = 500  # trace infos per search request
FIRST_RETRY_S, LAST_RETRY_S = 0.5, 8.0  # as the tracker retries a store that does not answer
# MLflow's error codes for a request the store refuses: asking again would change nothing
REFUSED = {
    "INVALID_PARAMETER_VALUE",
    "BAD_REQUEST",
    "RESOURCE_DOES_NOT_EXIST",
    "INVALID_STATE",
    "PERMISSION_DENIED",
    "UNAUTHENTICATED",
    "ENDPOINT_NOT_FOUND",
}
SIZE_KEY = "mlflow.trace.sizeBytes"  # the trace's size, in its metadata


@dataclass(frozen=True)
class Origin:
    """Where the traces were read, which of them were taken, and their digest."""

    uri: str
    experiments: tuple[str, ...]  # as named in data.mlflow.experiment
    experiment_ids: tuple[str, ...]
    filter: str | None
    label: str
    found: int  # traces the search returned (up to where max_traces stopped it)
    unlabelled: int  # without the label, or with a value that fits no pass rule
    digest: str  # of the selected traces' ids, label values and span content

    def source(self) -> dict:
        """The MLflow dataset's source: the store, experiment and filter the traces came from."""
        return {"tracking_uri": self.uri, "experiment": list(self.experiments), "filter": self.filter or ""}


@dataclass
class Selection:
    imported: Imported  # one run per selected trace, the skill from their system messages
    origin: Origin


@dataclass
class _Picked:
    """The selection as the pages come."""

    runs: list[Run] = field(default_factory=list)
    digests: dict[str, str] = field(default_factory=dict)
    found: int = 0
    unlabelled: int = 0
    unfit: list[str] = field(default_factory=list)  # "value on trace id", for the warning


def load_traces(data: DataConfig, uri: str, patience_s: float) -> Dataset:
    """The selected traces as the run's dataset (conversations held in memory)."""
    max_bytes = max_bytes_of(data.max_file_mb)
    selection = read_traces(data.mlflow, uri, max_bytes, patience_s)
    skill = selection.imported.skill
    if data.skill:
        skill = read_text(Path(data.skill), "data.skill", max_bytes)
    elif not skill:
        raise UserError("data.skill: the traces carry no system message to take the skill from; give it as a file")
    runs = selection.imported.runs
    return Dataset(
        skill=skill,
        results=sorted((Result(r.id, r.result["hard"], held=r.result) for r in runs), key=lambda r: r.id),
        predictions=Path(),
        max_bytes=max_bytes,
        conversations={r.id: r.conversation for r in runs},
        origin=selection.origin,
        selection=selection.origin.digest,
    )


def read_traces(t: TracesConfig, uri: str, max_bytes: int, patience_s: float) -> Selection:
    """The labelled traces data.mlflow selects, mapped to runs; a UserError naming the key when
    the store, an experiment or the filter is wrong, or when nothing is left."""
    reader = _Reader(uri, patience_s)
    named = [str(e) for e in (t.experiment if isinstance(t.experiment, list) else [t.experiment])]
    ids = [reader.experiment_id(name) for name in named]
    picked, token = _Picked(), None
    with _collector_paused():
        while True:
            page = reader.page(ids, t.filter, token)
            chosen = _labelled(page, t, picked)
            picked.runs += reader.runs(chosen, max_bytes, picked.digests)
            token = page.token
            if not token or (t.max_traces is not None and len(picked.runs) >= t.max_traces):
                break
    _reported(picked, t)
    digest = hashlib.sha256("".join(sorted(picked.digests.values())).encode()).hexdigest()[:16]
    origin = Origin(uri, tuple(named), tuple(ids), t.filter, str(t.label), picked.found, picked.unlabelled, digest)
    return Selection(_imported(picked.runs), origin)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cycle collector paused while traces are read: the runs kept grow the heap by millions
    of small objects, each full collection walks all of them, and reading 10,000 traces took three
    times as long with it on (bench/traces_read.py). What is read holds no cycles to collect."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def _labelled(page, t: TracesConfig, picked: _Picked) -> list[tuple[object, Label]]:
    """The page's traces that carry the label with a value fitting a pass rule, up to max_traces."""
    chosen: list[tuple[object, Label]] = []
    for trace in page:
        if t.max_traces is not None and len(picked.runs) + len(chosen) >= t.max_traces:
            break
        picked.found += 1
        label = label_of(trace.info, str(t.label), t.pass_threshold)
        if label is None or label.passed is None:
            picked.unlabelled += 1
            if label is not None:
                picked.unfit.append(f"{label.value!r} on {trace.info.trace_id}")
            continue
        chosen.append((trace.info, label))
    return chosen


def _reported(picked: _Picked, t: TracesConfig) -> None:
    """Nothing left is a mistake; values fitting no rule cost one warning; the counts one line."""
    if not picked.runs:
        why = f"{picked.found} found" + (f" with data.mlflow.filter {t.filter!r}" if t.filter else "")
        raise UserError(
            f"data.mlflow.label: no traces left to read: {why}, {picked.unlabelled} without a feedback "
            f"{t.label!r} that says pass or fail"
        )
    if picked.unfit:
        log.warning(
            "data.mlflow.label: %d trace(s) have a feedback %r that fits no pass rule (yes/true/pass, a "
            "non-zero number, a score against data.mlflow.pass_threshold), e.g. %s: counted as unlabelled",
            len(picked.unfit),
            t.label,
            picked.unfit[0],
        )
    failures = sum(1 for run in picked.runs if run.result["hard"] == 0)
    log.info(
        "read %d traces from MLflow: %d selected (%d failures, %d successes), %d unlabelled skipped",
        picked.found,
        len(picked.runs),
        failures,
        len(picked.runs) - failures,
        picked.unlabelled,
    )


def _imported(runs: list[Run]) -> Imported:
    """The skill is the system message most traces began with; a trace that began with another
    keeps its own as target_system_prompt (as the importers do)."""
    counts = Counter(run.system for run in runs if run.system is not None)
    skill = counts.most_common(1)[0][0] if counts else None
    for run in runs:
        if run.system is not None and run.system != skill:
            run.result["target_system_prompt"] = run.system
    return Imported(skill=skill or "", runs=runs)


class _Reader:
    """One store, asked with retries; its refusals and silences as one line naming the key."""

    def __init__(self, uri: str, patience_s: float) -> None:
        with one_at_a_time():
            from mlflow import MlflowClient
            from mlflow.tracing.client import TracingClient

        if urlsplit(uri).scheme in ("", "file"):
            raise UserError(
                f"data.mlflow.tracking_uri: {uri} is a file store, which keeps no trace feedback to select "
                "by: use a database store (sqlite:///...) or a tracking server"
            )
        local = unquote(uri[len("sqlite:///") :].split("?", 1)[0]) if uri.startswith("sqlite:///") else ""
        if local and local != ":memory:" and not Path(local).is_file():  # MLflow would make an empty one
            raise UserError(f"data.mlflow.tracking_uri: no store at {local}: point it at the store holding the traces")
        self.uri, self.patience_s = uri, patience_s
        self.client = self._asked(lambda: MlflowClient(tracking_uri=uri), "data.mlflow.tracking_uri")
        # the store itself, for its batch read of whole traces (the tracing client's `store`)
        self.store = self._asked(lambda: TracingClient(uri).store, "data.mlflow.tracking_uri")

    def experiment_id(self, name: str) -> str:
        found = self._asked(lambda: self.client.get_experiment_by_name(name), "data.mlflow.experiment")
        if found is None and name.isdigit():
            found = self._asked(lambda: _or_none(self.client.get_experiment, name), "data.mlflow.experiment")
        if found is None:
            raise UserError(f"data.mlflow.experiment: no experiment named {name!r} in {self.uri}")
        return str(found.experiment_id)

    def page(self, ids: list[str], filter_text: str | None, token):
        """One page of trace infos, without spans (search_traces' own paging, one request)."""
        return self._asked(
            lambda: self.client.search_traces(
                locations=ids, filter_string=filter_text, max_results=PAGE, page_token=token, include_spans=False
            ),
            "data.mlflow.filter",
        )

    def runs(self, chosen: list, max_bytes: int, digests: dict[str, str]) -> list[Run]:
        """The chosen traces with their spans, fetched in one request, as runs."""
        for info, _ in chosen:
            _check_size(info.trace_id, int(info.trace_metadata.get(SIZE_KEY) or 0), max_bytes)
        if not chosen:
            return []
        ids = [info.trace_id for info, _ in chosen]
        # one request: the clients' own batch reads ask ten traces at a time, on threads
        traces = {t.info.trace_id: t for t in self._asked(lambda: self.store.batch_get_traces(ids), "data.mlflow")}
        # a trace whose spans are not all written yet is left for a later run
        return [
            _run(traces[info.trace_id], label, max_bytes, digests) for info, label in chosen if info.trace_id in traces
        ]

    def _asked(self, ask, key: str):
        """ask(), again while the store does not answer (as the tracker waits), up to patience_s."""
        with one_at_a_time():
            import tenacity
            from mlflow.exceptions import MlflowException
            from sqlalchemy.exc import InterfaceError, OperationalError

        def silent(exc: BaseException) -> bool:
            """The store gone or busy (a database that cannot be opened, a server not answering)."""
            if isinstance(exc, MlflowException):
                return exc.error_code not in REFUSED
            return isinstance(exc, (OSError, OperationalError, InterfaceError))

        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_delay(self.patience_s),
            wait=tenacity.wait_exponential(multiplier=FIRST_RETRY_S, min=FIRST_RETRY_S, max=LAST_RETRY_S),
            retry=tenacity.retry_if_exception(silent),
            before_sleep=self._waiting,
            reraise=True,
        )
        try:
            return retrying(ask)
        except MlflowException as exc:
            if silent(exc):
                raise self._silent(exc) from None
            raise UserError(f"{key}: MLflow refuses it: {one_line(exc.message)}") from None
        except (OSError, OperationalError, InterfaceError) as exc:
            raise self._silent(exc) from None

    def _waiting(self, state) -> None:
        if state.attempt_number == 1:  # said once, as the tracker says it
            why = one_line(str(state.outcome.exception()))[:200]
            log.info("MLflow at %s did not answer (%s); asking again for up to %g s", self.uri, why, self.patience_s)

    def _silent(self, exc: BaseException) -> UserError:
        return UserError(
            f"data.mlflow.tracking_uri: the store at {self.uri} did not answer while traces were read "
            f"({one_line(str(exc))[:300]}); nothing was called: run again once it answers"
        )


def _or_none(get, name: str):
    """get(name), None when the store has no such experiment."""
    with one_at_a_time():
        from mlflow.exceptions import MlflowException

    try:
        return get(name)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise


def _check_size(trace_id: str, size: int, max_bytes: int) -> None:
    if size > max_bytes:
        raise UserError(
            f"data.max_file_mb: trace {trace_id} is {size / 1024 / 1024:.1f} MB, over the "
            f"{max_bytes / 1024 / 1024:g} MB reflact reads; raise data.max_file_mb or leave it out with "
            "data.mlflow.filter"
        )


def _run(trace, label: Label, max_bytes: int, digests: dict[str, str]) -> Run:
    """One selected trace as a run (SPEC 1 row and conversation); its digest noted by id."""
    trace_id = check_id(trace.info.trace_id, f"trace {trace.info.trace_id!r}")
    spans = span_views(trace)
    try:
        row, converted = trace_row(trace, spans, label)
    except NoChat:
        raise UserError(
            f"data.mlflow.filter: trace {trace_id} has no CHAT_MODEL span, so no conversation to show; select "
            "agent traces, e.g. data.mlflow.filter=\"span.type = 'CHAT_MODEL'\""
        ) from None
    except UserError as exc:  # a chat message convert_messages cannot read
        raise UserError(f"data.mlflow: {exc}") from None
    text = json.dumps(converted.items, ensure_ascii=False)
    _check_size(trace_id, len(text.encode("utf-8", "surrogatepass")), max_bytes)
    content = [[s.name, s.span_type, s.inputs, s.outputs] for s in spans]
    shape = json.dumps([row, content], ensure_ascii=False, sort_keys=True, default=str)
    digests[trace_id] = hashlib.sha256(shape.encode("utf-8", "surrogatepass")).hexdigest()
    return Run(row, converted.items, converted.system, f"trace {trace_id}")


def import_traces(t: TracesConfig, uri: str, out: Path, force: bool, max_file_mb: float) -> Selection:
    """The selection written as a dataset folder (the importers' layout: results.jsonl last)."""
    check_output(out, force)
    selection = read_traces(t, uri, max_bytes_of(max_file_mb), patience_s=MlflowConfig().deadline_s)
    if not selection.imported.skill:
        selection.imported.warnings.append("the traces carry no system message; skill.md is empty")
    write_dataset(selection.imported, out, max_file_mb)
    return selection
