"""Loading and checking a dataset folder (SPEC 1) before any optimizer call.

Results are kept in memory (they are small); conversations are only checked here and read
again when their minibatch is rendered, so memory does not grow with the dataset.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from reflact.config import DataConfig, OnBadConversation, dataset_paths
from reflact.errors import UserError

EXTRA_FILES = ("target_system_prompt", "target_user_prompt", "spreadsheet_preview")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class RowFile:
    """A JSONL results file that rows are read back from, by byte offset, when their
    minibatch is rendered: memory then does not grow with the size of the rows."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self, offset: int, length: int) -> dict:
        with open(self.path, "rb") as handle:
            handle.seek(offset)
            return json.loads(handle.read(length))


@dataclass(frozen=True, slots=True)
class Result:
    id: str
    hard: float
    held: dict | None = None  # the row itself (rows of a JSON array), else read back from `source`
    source: RowFile | None = None
    offset: int = 0
    length: int = 0

    @property
    def fields(self) -> dict:
        """The whole row: the prompt's task, reason, steps and extras."""
        return self.held if self.held is not None else self.source.read(self.offset, self.length)


@dataclass
class Dataset:
    skill: str
    results: list[Result]  # sorted by id
    predictions: Path
    max_bytes: int
    skipped: dict[str, str] = field(default_factory=dict)  # id -> why it is not shown

    def conversation_path(self, run_id: str) -> Path:
        return self.predictions / run_id / "conversation.json"


@dataclass(frozen=True)
class Trajectory:
    fields: dict  # its results row
    conversation: list
    extras: dict[str, str]


def load_dataset(data: DataConfig) -> Dataset:
    if data.dir and not Path(data.dir).is_dir():
        raise UserError(f"data.dir: no such folder: {data.dir}")
    skill_path, results_path, predictions = dataset_paths(data)
    max_bytes = int(data.max_file_mb * 1024 * 1024)
    skill = read_text(skill_path, "data.skill", max_bytes)
    results = load_results(results_path, max_bytes)
    dataset = Dataset(skill=skill, results=results, predictions=predictions, max_bytes=max_bytes)
    for result in results:
        problem = check_conversation(dataset.conversation_path(result.id), max_bytes)
        if problem is None:
            continue
        kind, message = problem
        if kind == "bad" and data.on_bad_conversation is OnBadConversation.error:
            raise UserError(f"{message} (set data.on_bad_conversation=skip to skip such runs)")
        dataset.skipped[result.id] = message
    return dataset


def read_text(path: Path, key: str, max_bytes: int | None = None) -> str:
    if not path.is_file():
        raise UserError(f"{key}: no such file: {path}")
    try:
        return read_limited(path, max_bytes).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (byte {exc.start})") from None


def read_limited(path: Path, max_bytes: int | None, size_only: bool = False) -> bytes:
    size = path.stat().st_size
    if max_bytes is not None and size > max_bytes:
        raise UserError(f"{path}: {size:,} bytes, over the {max_bytes:,} that data.max_file_mb allows")
    return b"" if size_only else path.read_bytes()


def load_results(path: Path, max_bytes: int) -> list[Result]:
    if not path.is_file():
        raise UserError(f"data.results: no such file: {path}")
    read_limited(path, max_bytes, size_only=True)
    with open(path, "rb") as handle:
        is_array = handle.read(4096).lstrip().startswith(b"[")
    rows = _json_array_rows(path) if is_array else _jsonl_rows(path)
    seen: dict[str, str] = {}
    results = []
    for where, label, result in rows:
        if result.id in seen:
            raise UserError(f"{where}: duplicate id {result.id!r} (first on {seen[result.id]})")
        seen[result.id] = label
        results.append(result)
    if not results:
        raise UserError(f"{path}: no results in the file")
    return sorted(results, key=lambda r: r.id)


def loads(text: str, path: Path, line: int | None = None) -> object:
    """JSON from a file (or from line `line` of it); a UserError naming the file and line if not."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}:{line or exc.lineno}: not JSON ({exc.msg} at column {exc.colno})") from None


def finite_number(obj: dict, key: str, where: str) -> float:
    """A run's score: a finite number (not a bool), or a UserError naming the key and place."""
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        got = "missing" if key not in obj else repr(value)
        raise UserError(f"{where}: '{key}' must be a number (the run's score), got {got}")
    return float(value)


def _jsonl_rows(path: Path):
    """(where, label, Result) per non-blank line, read one line at a time; binary lines end at
    \n only (JSON strings may hold U+2028 and the like, which str.splitlines would break on)."""
    source = RowFile(path)
    offset = 0
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            start, offset = offset, offset + len(raw)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise UserError(f"{path}:{number}: not UTF-8 text (byte {exc.start} of the line)") from None
            if not line.strip():
                continue
            where = f"{path}:{number}"
            row = _result(loads(line, path, number), where)
            yield where, f"line {number}", Result(row.id, row.hard, source=source, offset=start, length=len(raw))


def _json_array_rows(path: Path):
    items = loads(read_text(path, "data.results"), path)
    if not isinstance(items, list):
        raise UserError(f"{path}: expected a JSON array of results")
    # an array has no useful line numbers: name the item instead
    for number, item in enumerate(items, 1):
        where = f"{path}: item {number}"
        yield where, f"item {number}", _result(item, where)


def _result(obj: object, where: str) -> Result:
    if not isinstance(obj, dict):
        raise UserError(f"{where}: a result must be a JSON object, got {type(obj).__name__}")
    if "id" not in obj:
        raise UserError(f"{where}: result has no 'id'")
    return Result(id=check_id(obj["id"], where), hard=finite_number(obj, "hard", where), held=obj)


def check_id(value: object, where: str) -> str:
    """An id names a folder under predictions/: it must be one safe path component."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise UserError(f"{where}: 'id' must be a string, got {type(value).__name__}")
    run_id = str(value)
    if (
        not run_id.strip()
        or run_id in (".", "..")
        or "/" in run_id
        or "\\" in run_id
        or _CONTROL.search(run_id)
    ):
        raise UserError(f"{where}: unsafe id {run_id!r} (it must be a single folder name)")
    return run_id


def check_conversation(path: Path, max_bytes: int) -> tuple[str, str] | None:
    """None when usable; ("skip", why) when missing or empty; ("bad", why) when corrupt or too large
    (the conversation, or an extras file beside it)."""
    if not path.is_file():
        return "skip", "missing conversation"
    for key in EXTRA_FILES:
        extra = path.parent / f"{key}.txt"
        if extra.is_file() and extra.stat().st_size > max_bytes:
            return "bad", f"{extra}: {extra.stat().st_size:,} bytes, over the {max_bytes:,} that data.max_file_mb allows"
    try:
        conversation = parse_conversation(path, max_bytes)
    except (ValueError, UserError) as exc:
        return "bad", str(exc)
    if not conversation:
        return "skip", "empty conversation"
    return None


def parse_conversation(path: Path, max_bytes: int | None = None) -> list:
    raw = read_limited(path, max_bytes)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    if not text.strip():
        return []
    try:
        conversation = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(conversation, list):
        raise ValueError(f"{path}: a conversation must be a JSON list, got {type(conversation).__name__}")
    return conversation


def load_trajectory(dataset: Dataset, result: Result) -> Trajectory:
    conversation = parse_conversation(dataset.conversation_path(result.id), dataset.max_bytes)
    fields = result.fields
    extras = {"reference_text": fields.get("reference_text")}
    for key in EXTRA_FILES:
        value = fields.get(key)
        if not value:
            extra = dataset.predictions / result.id / f"{key}.txt"
            value = read_limited(extra, dataset.max_bytes).decode("utf-8", "replace") if extra.is_file() else ""
        extras[key] = value
    return Trajectory(fields=fields, conversation=conversation, extras=extras)
