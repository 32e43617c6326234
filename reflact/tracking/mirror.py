"""The MLflow run that mirrors one run dir, written from the stage's events: opened with its name,
tags, params, dataset and prompts; each settled minibatch's metrics and files; each request's
trace; the totals so far; at the end the run's counts and files and its true status and end time.

Live tracking (reflact.tracking.live) feeds it events as they happen; relog feeds it the same events rebuilt
from a finished run dir, so both write the same names and values.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

from reflact.config import OptimizerConfig, ReflectConfig, priced
from reflact.core.groups import GROUPS
from reflact.core.imports import one_at_a_time
from reflact.core.modes import get_mode
from reflact.core.text import one_line
from reflact.inputs.dataset import Dataset
from reflact.prompting.prompts import SystemPrompts, content_hash, overrides_of
from reflact.running.events import BatchNoted, MinibatchEnded, Planned
from reflact.running.outcome import Outcome
from reflact.running.rundir import RunDir
from reflact.running.summary import dataset_counts
from reflact.tracking.description import Setting, note_tags, run_description
from reflact.tracking.nesting import PARENT_TAG, nest, parent_of
from reflact.tracking.process import RunContext
from reflact.tracking.provenance import edit_feedback
from reflact.tracking.registry import register_skill
from reflact.tracking.store import (
    METRICS_PER_WRITE,
    OPENING_METRIC,
    Store,
    analysis_metrics,
    batch_view,
    context_tags,
    dataset_digest,
    end_run,
    minibatch_metrics,
    now_ms,
    prompt_name,
    resume,
    run_name,
    setting_metrics,
    sweep_id,
    total_metrics,
)

log = logging.getLogger("reflact")
# on a run whose end could not be written whole: what it lacks, and the command that writes it
MISSING_TAG = "reflact.missing"


@dataclass
class Totals:
    """The run's totals so far, as minibatches settle."""

    planned: int = 0
    ended: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    sums: dict[str, float] = field(default_factory=dict)
    priced: bool = True  # false: the model has no price, so no cost is summed (unknown, not 0)

    def add(self, o: Outcome) -> None:
        self.ended += 1
        self.by_status[o.status] = self.by_status.get(o.status, 0) + 1
        costs = {"cost_usd": o.cost_usd, "spent_usd": o.spent_usd} if self.priced else {}
        for key, value in {
            "calls": o.calls,
            "edits_proposed": o.proposed,
            "edits_kept": o.kept,
            "tokens_prompt": o.usage.prompt,
            "tokens_completion": o.usage.completion,
            **costs,
        }.items():
            self.sums[key] = self.sums.get(key, 0.0) + value

    def counts(self) -> dict[str, float]:
        counts = {"minibatches_ended": self.ended, "progress": self.ended / self.planned if self.planned else 1.0}
        counts.update({f"minibatches_{status}": n for status, n in self.by_status.items()})
        return {**counts, **self.sums}


@dataclass
class Batch:
    """Metrics (key, value, step), run tags, tables (name -> columns) and files (path, artifact
    folder) to log in one write. A write empties it as it goes, so that a write retried after a
    failure sends only what is left (a metric sent twice would be two points of its series)."""

    rows: list[tuple[str, float, int]] = field(default_factory=list)
    files: list[tuple[Path, str]] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)
    tables: dict[str, dict[str, list]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.rows or self.files or self.tags or self.tables)

    def extend(self, other: Batch) -> None:
        self.rows += other.rows
        self.files += other.files
        self.tags.update(other.tags)
        self.tables.update(other.tables)

    def take(self) -> Batch:
        """What is left, moved out of this batch."""
        left = Batch(self.rows, self.files, self.tags, self.tables)
        self.rows, self.files, self.tags, self.tables = [], [], {}, {}
        return left

    def missing(self) -> str:
        """What is left, in words."""
        parts = [
            f"{len(self.rows)} metric values" if self.rows else "",
            f"{len(self.tables) + len(self.files)} files" if self.tables or self.files else "",
        ]
        return ", ".join(filter(None, parts)) or "the run's status"


@dataclass
class Batches:
    """The run's batches (reflact.running.batch) as its MLflow run shows them: their ids as the tag
    `reflact.batches`, each one's status and counts as it waits (`batch_view`); a sweep's job names
    the batches that answered its calls."""

    ids: set[str] = field(default_factory=set)

    def noted(self, event: BatchNoted) -> Batch:
        self.ids.update(str(note["id"]) for note in event.batches if note.get("id"))
        tags, metrics = batch_view(event.batches)
        return Batch([(key, value, event.step) for key, value in metrics.items()], tags={**tags, **self._tag()})

    def used(self, outcome: Outcome) -> dict[str, str]:
        """The tag again when the minibatch's calls name a batch not named yet."""
        found = {str(call["batch_id"]) for call in outcome.call_log if call.get("batch_id")}
        if found <= self.ids:
            return {}
        self.ids |= found
        return self._tag()

    def _tag(self) -> dict[str, str]:
        return {"reflact.batches": ",".join(sorted(self.ids))} if self.ids else {}


def scheduled_run(store: Store, c: RunContext) -> str:
    """The MLflow run of this run dir its batch left SCHEDULED in this store, when it still is ("" if none)."""
    record = c.run_dir.mlflow_record()
    if record.get("status") != "SCHEDULED" or record.get("tracking_uri") != store.uri:
        return ""
    try:
        run = store.client.get_run(str(record.get("run_id")))
    except Exception:  # deleted meanwhile, or not of this store: a new run is made
        return ""
    scheduled = run.info.status == "SCHEDULED" and run.info.lifecycle_stage == "active"
    return run.info.run_id if scheduled else ""


class Mirror:
    def __init__(self, store: Store, context: RunContext) -> None:
        self.store = store
        self.context = context
        self.positions: dict[str, int] = {}
        self.totals = Totals(priced=priced(context.optimizer))
        self._ending: Batch | None = None  # the end's write, once made (what a failed try left of it)
        self.batches = Batches()
        self.setting = run_setting(context.reflect, context.optimizer)  # what its description names
        self._handed_back = False  # the patched skill registered, the source traces given their feedback

    def open(self) -> str:
        """Creates the run (replacing any earlier one of the run dir), RUNNING since the run's start;
        one its batch left SCHEDULED is taken up again instead (its params kept, new ones added)."""
        c = self.context
        parent = parent_of(self.store.uri, c)
        if parent:
            nest(self.store, parent)
        left = scheduled_run(self.store, c)
        self.store.retire(c.run_dir.root, keep=left)
        hashes = c.template_hashes or (c.system.hashes() if c.system is not None else {})
        params = {**c.params, **{f"template_hash.{group}": h for group, h in hashes.items()}}
        if left:
            held = resume(self.store, left)
            self.store.log_params({key: value for key, value in params.items() if key not in held})
            return left
        run_id = self.store.create(run_name(c.reflect, c.optimizer, c.job), self._tags(), int(c.started_at * 1000))
        self.store.log_params(params)
        opening = [(OPENING_METRIC, 0.0, 0)]  # first: the compare view opens on it, not on M
        self.store.log_metrics(
            opening + [(k, float(v), 0) for k, v in setting_metrics(c.reflect, c.optimizer).items()], now_ms()
        )
        if c.dataset is not None:
            log_dataset(self.store, c, c.dataset)
        if c.system is not None:
            link_prompts(self.store, c, c.system)
        return run_id

    def write(self, events: list) -> None:
        """The plan's and settled minibatches' metrics and files (traces: `Store.traces`)."""
        self.log(self.batch(events))

    def batch(self, events: list) -> Batch:
        """The events' metrics and files, counted into the run's totals (once: a write that fails
        is retried with the same batch)."""
        batch = Batch()
        for event in events:
            if isinstance(event, Planned):
                self.positions = {mb.tag: i for i, mb in enumerate(event.plan)}
                self.totals.planned = len(event.plan)
                batch.rows.append(("minibatches", float(len(event.plan)), 0))
            elif isinstance(event, MinibatchEnded):
                batch.rows += self._ended(event.outcome)
                batch.files += self.context.run_dir.minibatch_files(event.outcome.tag, event.patch is not None)
                batch.tags.update(self.batches.used(event.outcome))
            elif isinstance(event, BatchNoted):
                batch.extend(self.batches.noted(event))
        if any(isinstance(e, MinibatchEnded) for e in events):
            totals = total_metrics(self.totals.counts(), self.context.optimizer.dry_run)
            batch.rows += [(key, value, self.totals.ended) for key, value in totals.items()]
        return batch

    def log(self, batch: Batch) -> None:
        """Writes `batch`, emptying it as each part is written."""
        for name, table in list(batch.tables.items()):  # each table's tag goes with the metrics
            batch.tags.update(self.store.log_table(table, name))
            del batch.tables[name]
        while batch.rows or batch.tags:
            chunk = batch.rows[:METRICS_PER_WRITE]
            self.store.log_metrics(chunk, now_ms(), batch.tags)
            del batch.rows[: len(chunk)]
            batch.tags = {}
        while batch.files:
            self.store.log_files(batch.files[:1])
            del batch.files[0]

    def end(self, summary: dict | None, status: str, end_ms: int | None = None, last: Batch | None = None) -> None:
        """The run's counts and files (when it got as far as its summary), with `last` (the stage's
        last minibatches, in the same write), then its status. Retried after a failure, it writes
        only what is left."""
        if self._ending is None:
            self._ending = self._end_batch(summary)
        if last is not None:
            self._ending.extend(last.take())
        self.log(self._ending)
        if self.context.mlflow.trace_calls:
            _flush_traces()
        if summary is not None and status == "FINISHED" and not self._handed_back:  # once, not on a retried end
            self._handed_back = hand_back(self.store, self.context)
        end_run(self.store, status, end_ms or now_ms())

    def abandon(self, status: str, end_ms: int, why: str) -> None:
        """The end's last try when its writes keep failing: the run's true status, and a tag saying
        what it lacks and which command writes it, so that it is never left RUNNING for good."""
        missing = self._ending.missing() if self._ending is not None else "its end"
        relog = f"python -m reflact.relog {self.context.run_dir.root}"
        lacking = f"{missing} not written ({why}); {relog}"
        described = note_tags(run_description(self.setting, self.totals.counts(), lacking))
        self.store.log_metrics([], now_ms(), {MISSING_TAG: lacking, **described})
        end_run(self.store, status, end_ms)

    def _end_batch(self, summary: dict | None) -> Batch:
        """The end's own metrics, files and tags: the run's counts and files when it got as far as its
        summary, and the kept-items table's tag."""
        if summary is None:  # stopped before its summary: the totals so far
            return Batch(tags=note_tags(run_description(self.setting, self.totals.counts())))
        dry_run = self.context.optimizer.dry_run
        rows = [(k, v, self.totals.ended) for k, v in total_metrics(summary["counts"], dry_run).items()]
        for record in summary["minibatches"]:
            step = self.positions.get(record["tag"], 0)
            rows += [(k, v, step) for k, v in minibatch_metrics(record).items() if k == "minibatch/apply_share"]
        rows += self._analysis_rows()
        tags = note_tags(run_description(self.setting, summary["counts"]))
        return Batch(rows, self.context.run_dir.run_files(), tags, kept_items_table(self.context.run_dir))

    def _analysis_rows(self) -> list[tuple[str, float, int]]:
        """The run's analysis.json as metrics: run figures, and each minibatch's agreement over its
        draws at the step of its first draw."""
        analysis = self.context.run_dir.analysis()
        if analysis is None:
            return []
        rows = [(key, value, self.totals.ended) for key, value in analysis_metrics(analysis).items()]
        for record in analysis.get("minibatches", []):
            step = self.positions.get(record["minibatch"], 0)
            if isinstance(record.get("agreement"), (int, float)):
                rows.append(("minibatch/agreement", float(record["agreement"]), step))
        return rows

    def _ended(self, outcome: Outcome) -> list[tuple[str, float, int]]:
        self.totals.add(outcome)
        step = self.positions.get(outcome.tag, self.totals.ended - 1)
        record = {**asdict(outcome), **({} if self.totals.priced else {"cost_usd": None})}
        return [(key, value, step) for key, value in minibatch_metrics(record).items()]

    def _tags(self) -> dict[str, str]:
        c = self.context
        tags = context_tags(c.optimizer.dry_run, c.run_dir.root, c.launch_dir, list(c.overrides))
        tags.update(note_tags(run_description(self.setting, None)))  # its setting, until its end says more
        if c.sweep_dir is not None:
            tags["reflact.sweep_id"] = sweep_id(c.sweep_dir, c.launch_dir)
            tags["reflact.job"] = str(c.job)
        parent = parent_of(self.store.uri, c)
        return {**tags, PARENT_TAG: parent} if parent else tags


def kept_items_table(run_dir: RunDir) -> dict[str, dict[str, list]]:
    """The kept items as the table `kept_items.json` (none without kept items)."""
    rows = list(run_dir.kept_items())
    if not rows:
        return {}
    table = {
        "minibatch": [r["minibatch"] for r in rows],
        "position": [r["position"] for r in rows],
        "trajectory_ids": [", ".join(r["trajectory_ids"]) for r in rows],
        "item": [json.dumps(r["item"], ensure_ascii=False) for r in rows],
        "apply_status": [r.get("apply", {}).get("status", "") for r in rows],
    }
    return {"kept_items.json": table}


def run_setting(r: ReflectConfig, o: OptimizerConfig) -> Setting:
    """What a run's description names of its settings."""
    return Setting(get_mode(r.update_mode).short, r.minibatch_size, r.edit_budget, r.seed, o.model, o.dry_run)


def log_dataset(store: Store, c: RunContext, dataset: Dataset) -> None:
    """The dataset as an MLflow dataset input: the runs table's Datasets column, and its filters."""
    if dataset.origin is not None:  # read from traces: named by experiment, its source the filter too
        o = dataset.origin
        profile = {**dataset_counts(dataset, c.reflect), "found": o.found}
        store.log_dataset(f"traces:{','.join(o.experiments)}", o.digest, o.source(), profile, "mlflow_traces")
        return
    skill, results = dataset.paths
    conversations = [dataset.conversation_path(r.id) for r in dataset.results if r.id not in dataset.skipped]
    profile = dataset_counts(dataset, c.reflect)  # as summary.json counts
    folder = Path(c.data.dir).resolve() if c.data.dir else results.resolve()
    digest = dataset_digest(skill, results, conversations)
    if dataset.source is not None:  # the skill is a prompt version, not a file: its name and version
        source = f"{digest}/{dataset.source.name}/{dataset.source.version}"
        digest = hashlib.sha256(source.encode("utf-8")).hexdigest()[:16]
    store.log_dataset(folder.name, digest, folder.as_uri(), profile)


def link_prompts(store: Store, c: RunContext, system: SystemPrompts) -> None:
    """The templates in MLflow's prompt registry; a registry that fails costs a warning, not the run."""
    overrides = overrides_of(c.prompts)
    try:
        for group in GROUPS:
            text = system.text(group.name)
            name = prompt_name(
                group.name,
                c.reflect.update_mode,
                system.notes_allowed[group.name],
                bool(overrides[group.name]),
                c.reflect.provenance,
            )
            store.link_prompt(name, text, content_hash(text))
    except Exception as exc:  # the template hashes are params either way
        log.warning("the templates could not be linked from MLflow's prompt registry: %s", one_line(exc))


def hand_back(store: Store, c: RunContext) -> bool:
    """What a finished run gives back to MLflow beyond its own run: the patched skill as a version in
    the Prompt Registry (mlflow.register_skill) and a `reflact.edit` feedback on each source trace of
    a kept item (mlflow.edit_feedback). A registry or trace store that fails costs a warning."""
    if c.dataset is None or c.optimizer.dry_run:
        return True
    if c.mlflow.register_skill:
        try:
            register_skill(store, c)
        except Exception as exc:  # the run dir keeps the edits: a warning, not the run
            log.warning("the patched skill could not be registered in MLflow's Prompt Registry: %s", one_line(exc))
    if c.mlflow.edit_feedback:
        try:
            edit_feedback(store, c)
        except Exception as exc:
            log.warning("the reflact.edit feedback could not be written on the source traces: %s", one_line(exc))
    return True


def _flush_traces() -> None:
    """Traces are written on the tracker's thread (reflact turns MLflow's async trace logging off);
    a user who turned it back on gets them flushed before the run ends."""
    with one_at_a_time():
        import mlflow

    flush = getattr(mlflow, "flush_trace_async_logging", None)
    if flush:
        flush()
