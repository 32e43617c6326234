"""The run dir: the one module that knows its layout. Everything else asks it for a path or a record.

    patches/<minibatch>.json            the saved patch (what resume trusts; written last, fsynced)
    calls/<minibatch>/system.md         the exact prompt: system message,
    calls/<minibatch>/user.md, user_N.md  user message of each part when split to fit
    calls/<minibatch>/reply_N.txt       every raw reply, numbered over the minibatch's requests
    calls/<minibatch>/outcome.json      the minibatch's record (reflact.running.outcome.Outcome)
                                        (with optimizer.samples > 1 each further draw d of a
                                        minibatch is one more <minibatch>.d<d> in all of these)
    preview/<minibatch>.skill.md, .diff what the patch would do to the skill
    summary.json, kept_items.jsonl      the run's counts and records; every kept item
    analysis.json                       agreement, redundancy and distinct items (reflact.analysis.figures)
    report.md                           the run readable without MLflow
    mlflow_run.json                     the MLflow run this dir is logged as
    traces.jsonl                        each request as MLflow traces it (what relog rebuilds them from)
    batch/                              with optimizer.execution=batch: the batch's state and files (BatchFiles)
    .hydra/                             the resolved config (written once the inputs passed their checks)

Every write is atomic (a temporary file, then a rename), so a run killed at any moment leaves
whole files, and the next run removes the temporaries.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, fields
from pathlib import Path
from typing import TypeGuard

from reflact.calls.cache import cache_key
from reflact.calls.protocol import Reply, Usage
from reflact.config import Shape
from reflact.core.errors import UserError
from reflact.core.files import atomic_writer, lock_file, read_json, repair_text, write_json, write_text
from reflact.core.text import shown
from reflact.prompting.plan import is_tag
from reflact.running.events import Replied
from reflact.running.outcome import Outcome

log = logging.getLogger("reflact")

SUMMARY = "summary.json"
ANALYSIS = "analysis.json"
KEPT_ITEMS = "kept_items.jsonl"
REPORT = "report.md"
MLFLOW_RUN = "mlflow_run.json"
TRACES = "traces.jsonl"
HYDRA = ".hydra"
USAGE_FIELDS = {f.name for f in fields(Usage)}
# a number read back is finite and far inside float's and SQL's limits: beyond any count, token
# total or dollar figure a run records
LARGEST = 1e15
# epoch seconds read back are before 2100: as MLflow's nanoseconds they still fit 64 bits
LATEST = 4_102_444_800.0


class RunDir:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.patches = self.root / "patches"
        self.calls = self.root / "calls"
        self.preview = self.root / "preview"

    def __truediv__(self, name: str) -> Path:
        return self.root / name

    # ------------------------------------------------------------------ paths

    def patch_path(self, tag: str) -> Path:
        return self.patches / f"{_named(self.root, tag)}.json"

    def call_dir(self, tag: str) -> Path:
        return self.calls / _named(self.root, tag)

    def system_path(self, tag: str) -> Path:
        return self.call_dir(tag) / "system.md"

    def user_path(self, tag: str, part: int) -> Path:
        return self.call_dir(tag) / ("user.md" if part == 1 else f"user_{part}.md")

    def reply_path(self, tag: str, number: int) -> Path:
        return self.call_dir(tag) / f"reply_{number}.txt"

    def preview_paths(self, tag: str) -> tuple[Path, Path]:
        """(candidate skill, diff)."""
        tag = _named(self.root, tag)
        return self.preview / f"{tag}.skill.md", self.preview / f"{tag}.diff"

    # ------------------------------------------------------------------ the stage's writes

    def clean(self) -> None:
        """Removes the half-written files of a run that was killed (see _leftovers)."""
        self.patches.mkdir(parents=True, exist_ok=True)
        for leftover in _leftovers(self):
            leftover.unlink(missing_ok=True)

    def write_prompt(self, tag: str, parts: list[list[dict]]) -> None:
        """The messages of each part; replies, parts and the patch of an earlier, stale attempt go
        (a redo that fails then leaves no patch of other settings behind)."""
        folder = self.call_dir(tag)
        for old in [*folder.glob("reply_*.txt"), *folder.glob("user_*.md")]:
            old.unlink()
        self.patch_path(tag).unlink(missing_ok=True)
        write_text(self.system_path(tag), parts[0][0]["content"])
        for number, part in enumerate(parts, 1):
            write_text(self.user_path(tag, number), part[1]["content"])

    def write_reply(self, tag: str, number: int, text: str) -> None:
        write_text(self.reply_path(tag, number), text)

    def write_outcome(self, outcome: Outcome) -> None:
        write_json(self.call_dir(outcome.tag) / "outcome.json", asdict(outcome), indent=None)

    def save_patch(self, outcome: Outcome, patch: dict) -> dict:
        """The record first: a patch on disk (what resume trusts) always has its record. Returns
        the patch as saved (as a rerun reads it: text that cannot be written repaired)."""
        self.write_outcome(outcome)
        text = write_json(self.patch_path(outcome.tag), patch, durable=True)
        repaired = repair_text(text)
        return patch if repaired is text else json.loads(repaired)

    def patch(self, tag: str) -> dict | None:
        """The saved patch, or None when there is none, or it is unreadable or not of the shape
        the stage writes (a file damaged on disk): then it is redone."""
        saved = read_json(self.patch_path(tag))
        return saved if _patch_ok(saved) else None

    def outcome_record(self, tag: str) -> dict | None:
        """The minibatch's saved record, or None when there is none or its figures are damaged
        (a resumed patch then counts no tokens and no cost, as when the record is missing)."""
        saved = read_json(self.call_dir(tag) / "outcome.json")
        return saved if _outcome_ok(saved) else None

    def summary(self) -> dict | None:
        return _object(read_json(self / SUMMARY))

    def analysis(self) -> dict | None:
        return _object(read_json(self / ANALYSIS))

    def write_analysis(self, analysis: dict) -> None:
        write_json(self / ANALYSIS, analysis)

    def kept_items(self) -> Iterator[dict]:
        """Every kept item, one at a time."""
        path = self / KEPT_ITEMS
        if not path.is_file():
            return
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                yield json.loads(line)

    # ------------------------------------------------------------------ the run's own files

    def write_summary(self, summary: dict) -> None:
        # compact: json's fast encoder only runs without indent, and the file is for programs
        # (report.md is the one for people)
        write_json(self / SUMMARY, summary, indent=None)

    def kept_items_writer(self):
        return atomic_writer(self / KEPT_ITEMS)

    def report_writer(self):
        return atomic_writer(self / REPORT)

    def write_config(self, config_yaml: str, overrides_yaml: str, hydra_yaml: str | None = None) -> None:
        folder = self / HYDRA
        write_text(folder / "config.yaml", config_yaml)
        write_text(folder / "overrides.yaml", overrides_yaml)
        if hydra_yaml is not None:  # runs from the command line (Hydra's own settings: run mode, sweep dir)
            write_text(folder / "hydra.yaml", hydra_yaml)

    # ------------------------------------------------------------------ what tracking mirrors

    def minibatch_files(self, tag: str, with_patch: bool) -> list[tuple[Path, str]]:
        """(file, artifact folder) of one minibatch: its prompt, replies, record (and patch)."""
        folder = self.call_dir(tag)
        files = [(path, f"calls/{tag}") for path in sorted(folder.iterdir())] if folder.is_dir() else []
        files = [pair for pair in files if not pair[0].name.startswith(".")]
        return _own(self.root, files + [(self.patch_path(tag), "patches")] if with_patch else files)

    def run_files(self) -> list[tuple[Path, str]]:
        """(file, artifact folder) of the run's own files and previews that exist."""
        names = [
            (SUMMARY, "run"),
            (KEPT_ITEMS, "run"),
            (REPORT, "run"),
            (ANALYSIS, "run"),
            (f"{HYDRA}/config.yaml", "run/hydra"),
            (f"{HYDRA}/overrides.yaml", "run/hydra"),
        ]
        files = [(self / name, folder) for name, folder in names if (self / name).is_file()]
        return _own(self.root, files + [(path, "preview") for path in sorted(self.preview.glob("*"))])

    def batch_files(self) -> BatchFiles:
        return BatchFiles(self.root)

    def mlflow_record(self) -> dict:
        """The MLflow run this dir was logged as: run_id, tracking_uri, status, digest."""
        return _object(read_json(self / MLFLOW_RUN)) or {}

    def write_mlflow_record(self, record: dict) -> None:
        write_json(self / MLFLOW_RUN, record)


def _named(root: Path, tag: str) -> str:
    """A minibatch's name as its paths are built from: a plan tag, never a path of its own (the
    tools check every name they read back; this holds for a name they missed)."""
    if not is_tag(tag):
        raise UserError(f"{root}: damaged (a record names the minibatch {shown(tag)}, which is no plan tag)")
    return tag


def _own(root: Path, files: list[tuple[Path, str]]) -> list[tuple[Path, str]]:
    """The (file, artifact folder) pairs whose file is one of the run dir's own: a link to a file
    elsewhere, or a folder linked from elsewhere, is not the run's record, and never logged."""
    inside = root.resolve()
    return [(path, folder) for path, folder in files if path.resolve().is_relative_to(inside)]


# ---------------------------------------------------------------------- each request's trace record


def trace_record(event: Replied) -> dict:
    """A request as the run dir keeps it for its trace (recorded_requests turns it back into the event)."""
    return {
        "tag": event.tag,
        "number": event.number,
        "messages": event.messages,
        "reply": asdict(event.reply) if event.reply is not None else None,
        "error": event.error,
        "cost_usd": event.cost_usd,
        "ended_at": event.ended_at,
    }


def recorded_requests(records: list[dict], source: Path | str = TRACES) -> list[Replied]:
    """Trace records (read from `source`) as the events their traces are written from; a damaged
    record (checked field by field: a trace of it would fail the whole write) is left out with one
    line."""
    events = []
    for record in records:
        damage = _trace_damage(record)
        if damage:
            where = f"{shown(record['tag'])}, request {shown(record['number'])}"
            log.warning("%s: the trace record of %s is damaged (%s); left out", source, where, damage)
            continue
        reply = record.get("reply")
        if reply is not None:
            reply = Reply(**{**reply, "usage": Usage(**reply["usage"])})
        events.append(
            Replied(
                record["tag"],
                record["number"],
                record["messages"],
                reply,
                record.get("error", ""),
                record.get("cost_usd", 0.0),
                record["ended_at"],
            )
        )
    return events


def _trace_damage(record: dict) -> str:
    """What is wrong with a trace record, field by field; empty when it is whole."""
    if not is_tag(record["tag"]):
        return "its tag is no plan tag"
    if not _count(record["number"]):
        return "its request number is no count"
    if not isinstance(record.get("messages"), list) or not all(isinstance(m, dict) for m in record["messages"]):
        return "its messages are no list of objects"
    if not isinstance(record.get("error", ""), str) or not _amount(record.get("cost_usd", 0.0)):
        return "its error or cost is damaged"
    if not _seconds(record.get("ended_at")):
        return f"ended_at {shown(record.get('ended_at'))} is no time"
    reply = record.get("reply")
    return "" if reply is None else _reply_damage(reply)


_REPLY_CHECKS = {  # each field of a Reply as a trace record holds it
    "text": lambda v: isinstance(v, str),
    "finish_reason": lambda v: v is None or isinstance(v, str),
    "usage": lambda v: isinstance(v, dict) and set(v) <= USAGE_FIELDS and all(map(_count, v.values())),
    "latency_s": lambda v: _seconds(v),
    "retries": lambda v: _count(v),
    "from_cache": lambda v: isinstance(v, bool),
    "structured": lambda v: isinstance(v, str),
    "started_at": lambda v: _seconds(v),
    "cache_key": lambda v: isinstance(v, str),
    "estimated": lambda v: isinstance(v, bool),
    "service_tier": lambda v: isinstance(v, str),
    "batch_id": lambda v: isinstance(v, str),
    "flex_unavailable": lambda v: _count(v),
}
_REPLY_NEEDS = ("text", "finish_reason", "usage", "latency_s")


def _reply_damage(reply: object) -> str:
    if not isinstance(reply, dict) or not set(_REPLY_NEEDS) <= set(reply) <= set(_REPLY_CHECKS):
        return "its reply is not of a reply's shape"
    wrong = next((key for key, fits in _REPLY_CHECKS.items() if key in reply and not fits(reply[key])), None)
    return f"reply.{wrong} {shown(reply[wrong])} does not fit" if wrong else ""


def append_trace(run_dir: RunDir, record: dict) -> int:
    """One request's trace record, appended in one write (ASCII JSON: a lone surrogate in a
    reply is escaped, never a failure); returns where its line starts. A line cut by a kill is
    skipped when read back. One writer at a time (the run's tracking observer holds a lock)."""
    line = (json.dumps(record, separators=(",", ":")) + "\n").encode("ascii")
    fd = os.open(run_dir / TRACES, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        return os.lseek(fd, 0, os.SEEK_CUR) - len(line)
    finally:
        os.close(fd)


class TraceRecords:
    """The run dir's trace records, the latest of each (minibatch, request) once (a redo replaces a
    request). The file is read through once, keeping where each record starts; records are read
    back when asked for, so a rerun of a large run dir holds none of them in memory."""

    def __init__(self, run_dir: RunDir) -> None:
        self.path = run_dir / TRACES
        self._at: dict[tuple[str, str], int] | None = None  # (minibatch, request) -> its line's offset

    def of(self, tags: set[str] | None = None) -> list[dict]:
        """The records of the minibatches `tags` (None: of all), in the order they were written."""
        at = self._index()
        offsets = sorted(offset for (tag, _), offset in at.items() if tags is None or tag in tags)
        records = []
        with contextlib.suppress(FileNotFoundError), open(self.path, "rb") as handle:
            for offset in offsets:
                handle.seek(offset)
                records.append(_trace_record(handle.readline()))
        return [record for record in records if record is not None]

    def at(self, offsets: list[int]) -> list[dict]:
        """The records whose lines start at `offsets` (as append_trace returned them), in that order."""
        records = []
        with contextlib.suppress(FileNotFoundError), open(self.path, "rb") as handle:
            for offset in offsets:
                handle.seek(offset)
                records.append(_trace_record(handle.readline()))
        return [record for record in records if record is not None]

    def _index(self) -> dict[tuple[str, str], int]:
        if self._at is None:
            self._at = {}
            with contextlib.suppress(FileNotFoundError), open(self.path, "rb") as handle:
                offset = 0
                for line in handle:
                    record = _trace_record(line)
                    if record is not None:
                        self._at[(str(record["tag"]), str(record["number"]))] = offset
                    offset += len(line)
        return self._at


def _trace_record(line: bytes) -> dict | None:
    """A trace record, or None for a line that is not one (cut by a kill, damaged)."""
    try:
        record = json.loads(line.decode("ascii", errors="replace"))
    except (ValueError, RecursionError):  # RecursionError: nested deeper than json can read
        return None
    return record if isinstance(record, dict) and "tag" in record and "number" in record else None


# ---------------------------------------------------------------------- shapes of what is read back


def _leftovers(run_dir: RunDir) -> list[Path]:
    """The temporaries a killed run left: the stage's, the summary's and the config's (not the
    MLflow record's, which the tracker may be writing as the stage starts)."""
    own = [run_dir.root.glob(f".{name}.*.tmp") for name in (SUMMARY, ANALYSIS, KEPT_ITEMS, REPORT)]
    return [
        *run_dir.patches.glob(".*.tmp"),
        *run_dir.calls.glob("*/.*.tmp"),
        *(run_dir / HYDRA).glob(".*.tmp"),
        *(path for found in own for path in found),
    ]


@contextlib.contextmanager
def locked(run_dir: RunDir):
    """One process per run dir at a time: a second one (two shells, a double launch) would pay
    for every call twice. The lock (`.lock`, holding the pid) goes with the process, however it ends."""
    run_dir.root.mkdir(parents=True, exist_ok=True)
    with open(run_dir / ".lock", "a+", encoding="utf-8") as handle:
        try:
            lock_file(handle)
        except OSError:  # BlockingIOError, or PermissionError from Windows' msvcrt
            other = _holder(handle)
            raise UserError(
                f"{run_dir.root} is in use by another reflact process{f' (pid {other})' if other else ''}"
                ": wait for it to end, or give this run its own hydra.run.dir"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield


def _holder(handle) -> str:
    """The pid the lock's holder wrote, where the platform lets a locked file be read."""
    try:
        handle.seek(0)
        return handle.read().strip()
    except OSError:
        return ""


def _object(saved: object) -> dict | None:
    return saved if isinstance(saved, dict) else None


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= LARGEST


def _amount(value: object) -> bool:
    """A non-negative figure read back (NaN fails every comparison)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= LARGEST


def _seconds(value: object) -> bool:
    """A time (epoch seconds) or a duration read back; their sum stays a time MLflow can store."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= LATEST


def _failed_job_ok(record: dict) -> bool:
    """A failed job's record as a multirun's end names it: its number, overrides and why."""
    overrides = record.get("overrides", [])
    return (
        _count(record.get("job"))
        and isinstance(overrides, list)
        and all(isinstance(o, str) for o in overrides)
        and isinstance(record.get("reason", ""), str)
    )


def _patch_ok(saved: object) -> TypeGuard[dict]:
    """What every saved patch has, whatever the mode: its fingerprint, count and patch object."""
    return (
        isinstance(saved, dict)
        and isinstance(saved.get("fingerprint"), str)
        and _count(saved.get("n_proposed"))
        and isinstance(saved.get("patch"), dict)
    )


def _outcome_ok(saved: object) -> TypeGuard[dict]:
    """Figures a resumed patch takes over: absent ones count as zero, damaged ones void the record."""
    if not isinstance(saved, dict):
        return False
    usage = saved.get("usage", {})
    return (
        isinstance(usage, dict)
        and set(usage) <= USAGE_FIELDS
        and all(map(_count, usage.values()))
        and _count(saved.get("reasks", 0))
        and all(_amount(saved.get(key, 0)) for key in ("cost_usd", "latency_s"))
    )


def fingerprint(s: Shape, messages: list[dict], draw: int = 0, selection: str = "") -> str:
    """What a saved patch must have been made from to be reused: everything that shapes the call,
    i.e. the model, mode, L, decoding settings, the draw's sample index (and the seed sent with it
    when there are several draws), and both messages (which hold the templates, the skill, the
    contexts and the trajectories), and for traces read from MLflow the digest of the whole
    selection (`selection`: ids, label values, span content), so changed feedback redoes them.
    `s`: config.shape, made from the keys config.SHAPING names."""
    shape = {
        "model": s.model,
        "mode": s.mode,
        "budget": s.budget,
        "temperature": s.temperature,
        "reasoning_effort": s.reasoning_effort,
        "sample": s.sample + draw,
        "messages": messages,
    }
    if selection:  # only then: a dataset folder's fingerprints stay what they were
        shape["selection"] = selection
    if s.samples > 1:  # only then is a seed sent: a single draw's fingerprint stays what it was
        shape["seed"] = s.sample + draw
    return cache_key(shape)


class BatchFiles:
    """A run's or a sweep's batch folder (reflact.running.batch):

    batch/state.json                    what went where: every input file, its batch, each request's state
    batch/input_NNN.jsonl               the requests of one input file, as uploaded
    batch/output_<batch id>.jsonl       a batch's output and error files, as downloaded
    batch/errors_<batch id>.jsonl
    """

    def __init__(self, root: Path) -> None:
        self.folder = Path(root) / "batch"

    @property
    def state_path(self) -> Path:
        return self.folder / "state.json"

    def state(self) -> object | None:
        """The state as saved (None when there is none; checked by its reader)."""
        return read_json(self.state_path)

    def write_state(self, state: dict) -> None:
        # durable: a power cut must not forget a batch that was paid for
        write_json(self.state_path, state, durable=True, indent=None)

    def input_path(self, number: int) -> Path:
        return self.folder / f"input_{number:03d}.jsonl"

    def downloaded_path(self, batch_id: str, kind: str) -> Path:
        """Where a batch's output (`output`) or error file (`errors`) is kept."""
        safe = batch_id if re.fullmatch(r"[A-Za-z0-9_.-]{1,100}", batch_id) and batch_id[0] != "." else None
        named = safe or hashlib.sha256(batch_id.encode("utf-8")).hexdigest()[:32]
        return self.folder / f"{kind}_{named}.jsonl"

    def own_file(self, name: str) -> Path | None:
        """A file of the folder by the name the state gives it; None for a name that is not one of its own."""
        return self.folder / name if re.fullmatch(r"input_\d{3,}\.jsonl", name) else None


PARENT_RECORD = "mlflow_parent.json"


def _parent(path: Path) -> dict:
    record = _object(read_json(path)) or {}
    whole = all(isinstance(record.get(key), str) and record[key] for key in ("run_id", "tracking_uri", "sweep_id"))
    return record if whole else {}


class SweepDir:
    """A multirun's folder: its jobs' run dirs, plus

    mlflow_parent.json   the sweep's MLflow parent run
    mlflow_parent.opening  while the parent run is being opened beside the jobs: the record
                         before (its run may be the one taken up again); jobs wait for the new one
    sweep.json           the settings its jobs share (and those they sweep)
    batch/               with optimizer.execution=batch: the batch of all its jobs (BatchFiles)
    failed_jobs/<n>.json each job of the latest multirun that failed: its number, overrides,
                         run dir and why (the multirun's end names them)
    report/              the grid report
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.report = self.root / "report"
        self._failed = self.root / "failed_jobs"
        self._opening = self.root / "mlflow_parent.opening"

    def batch_files(self) -> BatchFiles:
        return BatchFiles(self.root)

    def parent_record(self, wait_s: float = 0.0) -> dict:
        """The sweep's parent run (run_id, tracking_uri, sweep_id), or {} when there is none or its
        record is damaged (a job's run is then one of its own). While the parent is being opened
        (`set_parent_aside`), waits for it up to `wait_s`."""
        deadline = time.monotonic() + wait_s
        while True:
            record = _parent(self.root / PARENT_RECORD)
            if record or not self._opening.exists() or time.monotonic() >= deadline:
                return record
            time.sleep(0.05)

    def write_parent_record(self, record: dict) -> None:
        write_json(self.root / PARENT_RECORD, record)

    def set_parent_aside(self) -> None:
        """The parent run is being opened: its record moves aside (the run opening it may take its
        run up again) and the jobs wait for the new one (parent_record)."""
        with contextlib.suppress(FileNotFoundError):
            os.replace(self.root / PARENT_RECORD, self._opening)
        if not self._opening.exists():
            write_json(self._opening, {})

    def parent_set_aside(self) -> dict:
        """The record set aside while the parent is being opened ({} when none)."""
        return _parent(self._opening)

    def parent_settled(self) -> None:
        """The opening ended (a failure too): a record set aside is back unless a new one replaced it."""
        with contextlib.suppress(FileNotFoundError):
            if (self.root / PARENT_RECORD).exists():
                self._opening.unlink()
            else:
                os.replace(self._opening, self.root / PARENT_RECORD)

    def identity(self) -> dict:
        return _object(read_json(self.root / "sweep.json")) or {}

    def write_identity(self, identity: dict) -> None:
        write_json(self.root / "sweep.json", identity)

    def write_failed_job(self, number: int, record: dict) -> None:
        """One file per job: parallel jobs of a launcher's workers each write their own."""
        write_json(self._failed / f"{number}.json", {"job": number, **record})

    def failed_jobs(self) -> list[dict]:
        """The latest multirun's failed jobs, by number (a damaged record is left out)."""
        records = [_object(read_json(path)) for path in self._failed_records()]
        return sorted((r for r in records if r and _failed_job_ok(r)), key=lambda r: r["job"])

    def clear_failed_jobs(self) -> None:
        """A new multirun numbers its jobs afresh: the failures of the one before go."""
        for path in self._failed_records():
            path.unlink()

    def _failed_records(self) -> list[Path]:
        """The failed jobs' files: none when failed_jobs/ is a link (the sweep's own folder only)."""
        return [] if self._failed.is_symlink() else list(self._failed.glob("*.json"))

    def is_sweep(self) -> bool:
        return (self.root / "sweep.json").is_file() or (self.root / PARENT_RECORD).is_file()

    def runs(self) -> list[RunDir]:
        """Its jobs' run dirs that got as far as their summary, by path."""
        return self._holding(SUMMARY)

    def jobs(self) -> list[RunDir]:
        """Its jobs' run dirs that got as far as their summary or their MLflow run's end (a job
        stopped before its summary), by path."""
        return self._holding(SUMMARY, MLFLOW_RUN)

    def _holding(self, *names: str) -> list[RunDir]:
        """The folders below it holding one of `names`. A job folder is named after its overrides,
        so a value with a slash (data.dir=/data/x) nests it deeper: all levels are searched, but
        not inside a run dir."""
        found = []
        for folder, subfolders, files in os.walk(self.root):
            subfolders.sort()
            if not set(names).isdisjoint(files) and Path(folder) != self.root:
                found.append(RunDir(Path(folder)))
                subfolders.clear()
        return found

    @classmethod
    def holding(cls, run_dir: Path) -> SweepDir | None:
        """The sweep a run dir belongs to: the nearest folder above it that is a sweep dir."""
        return next((cls(folder) for folder in Path(run_dir).resolve().parents if cls(folder).is_sweep()), None)
