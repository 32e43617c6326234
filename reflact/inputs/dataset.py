"""Loading and checking a dataset folder (SPEC 1) before any optimizer call.

Results are kept in memory (they are small); conversations are only checked here and read
again when their minibatch is rendered, so memory does not grow with the dataset.

Everything read here may be hostile: files found by the layout must not link outside their
folder (a link to /proc/self/environ would send the key to the optimizer), only regular files
are read (a FIFO would hang the run), and JSON that Python cannot hold safely (nesting deep
enough to exhaust the stack, integers too long to convert) is bad input like any other.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, cast

from reflact.config import DataConfig, DataSource, OnBadConversation, dataset_paths
from reflact.core.errors import UserError
from reflact.inputs.registry import RegisteredSkill, is_prompt_uri, load_registered_skill

EXTRA_FILES = ("target_system_prompt", "target_user_prompt", "spreadsheet_preview")
MAX_JSON_DEPTH = 200  # far beyond real logs, far below what the JSON codec's recursion survives
NAME_MAX = 255  # bytes in one file name on common file systems
# control characters (C0, DEL, C1), line and paragraph separators, lone surrogates: everything
# str.splitlines() breaks on is among them
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True)
class Folder:
    """A folder input files must not link out of: as the user named it, and its real path."""

    given: Path
    real: Path

    @classmethod
    def of(cls, path: Path) -> Folder:
        return cls(path, Path(os.path.realpath(path)))

    def real_path(self, path: Path) -> str:
        """os.path.realpath(path), without looking up every component above this folder when
        nothing between it and `path` is a link (the usual case: a run folder and its files)."""
        return self.unlinked(path, os.path.islink(path)) or os.path.realpath(path)

    def unlinked(self, path: Path, is_link: bool) -> str | None:
        """The real path of `path` when it is inside this folder and neither it (`is_link`, from
        its lstat) nor any folder between is a link; else None."""
        given, name = str(self.given).rstrip(os.sep) + os.sep, str(path)
        parts = name[len(given) :].split(os.sep) if name.startswith(given) else [".."]
        if (
            is_link
            or ".." in parts
            or any(os.path.islink(given + os.sep.join(parts[:i])) for i in range(1, len(parts)))
        ):
            return None
        return os.path.join(self.real, *parts)

    def holds(self, real: str) -> bool:
        top = str(self.real).rstrip(os.sep)
        return real == top or real.startswith(top + os.sep)


class RowFile:
    """A JSONL results file that rows are read back from, by byte offset, when their
    minibatch is rendered: memory then does not grow with the size of the rows."""

    def __init__(self, path: Path, real: Path | None = None) -> None:
        self.path = path  # as the user named it, for messages
        self.real = real or path  # the checked file itself

    def read(self, offset: int, length: int) -> dict:
        with open_regular(self.real, self.path) as handle:
            handle.seek(offset)
            raw = handle.read(length)
        try:
            return cast(dict, decode_json(raw.decode("utf-8")))  # a row: checked an object when first read
        except (UnicodeDecodeError, BadJSON):
            raise UserError(f"{self.path}: changed since it was checked; run again") from None


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
        if self.held is not None:
            return self.held
        assert self.source is not None  # a row not held is read back from its file
        return self.source.read(self.offset, self.length)


@dataclass
class Dataset:
    skill: str
    results: list[Result]  # sorted by id
    predictions: Path
    max_bytes: int
    skipped: dict[str, str] = field(default_factory=dict)  # id -> why it is not shown
    root: Folder | None = None  # the predictions folder no conversation or extras file may leave
    paths: tuple[Path, ...] = ()  # (skill, results) as read
    source: RegisteredSkill | None = None  # the prompt version the skill came from (data.skill=prompts:/...)
    # read from MLflow traces (reflact.inputs.traces): each run's conversation held, not on disk
    conversations: dict[str, list] | None = None
    origin: Any = None  # then where they were read: a reflact.inputs.traces.Origin
    selection: str = ""  # then the digest of the traces read, part of each patch's fingerprint

    def conversation_path(self, run_id: str) -> Path:
        return self.predictions / run_id / "conversation.json"


@dataclass(frozen=True)
class Trajectory:
    fields: dict  # its results row
    conversation: list
    extras: dict[str, str]


def load_dataset(data: DataConfig, store_uri: str | None = None) -> Dataset:
    """`store_uri`: the run's MLflow store, whose Prompt Registry a `prompts:/` skill is read from."""
    if data.source is not DataSource.files:
        raise UserError(f"data.source={data.source.value}: no dataset folder to read (reflact.inputs.source reads it)")
    if data.dir and not Path(data.dir).is_dir():
        raise UserError(f"data.dir: no such folder: {data.dir}")
    skill_path, results_path, predictions = dataset_paths(data)
    # files found inside data.dir stay in it; paths given one by one are the user's choice
    base = Folder.of(Path(data.dir)) if data.dir else None
    max_bytes = max_bytes_of(data.max_file_mb)
    source = _registered(data, store_uri, max_bytes)
    skill = source.text if source else read_text(skill_path, "data.skill", max_bytes, root=None if data.skill else base)
    root = _predictions_root(data, predictions)
    name_max = _name_max(root.real)
    results = load_results(results_path, max_bytes, root=None if data.results else base, name_max=name_max)
    if results and not predictions.is_dir():  # a mistyped folder would skip every run, after no call
        raise UserError(f"data.predictions: no such folder: {predictions} (each run's conversation is read there)")
    dataset = Dataset(
        skill=skill,
        results=results,
        predictions=predictions,
        max_bytes=max_bytes,
        root=root,
        paths=(skill_path, results_path),
        source=source,
    )
    for result in results:
        problem = check_conversation(dataset.conversation_path(result.id), max_bytes, root)
        if problem is None:
            continue
        kind, message = problem
        if kind == "bad" and data.on_bad_conversation is OnBadConversation.error:
            raise UserError(f"{message} (set data.on_bad_conversation=skip to skip such runs)")
        dataset.skipped[result.id] = message
    return dataset


def _registered(data: DataConfig, store_uri: str | None, max_bytes: int) -> RegisteredSkill | None:
    if not is_prompt_uri(data.skill):
        return None
    if store_uri is None:
        raise UserError(f"data.skill: {data.skill} is read from an MLflow store, and none is known here")
    return load_registered_skill(str(data.skill), store_uri, max_bytes)


def max_bytes_of(max_file_mb: object) -> int:
    size = max_file_mb * 1024 * 1024 if isinstance(max_file_mb, (int, float)) else math.nan
    if isinstance(max_file_mb, bool) or not math.isfinite(size) or size <= 0:
        raise UserError(f"data.max_file_mb: must be a positive number, got {max_file_mb!r}")
    return int(size)


def _predictions_root(data: DataConfig, predictions: Path) -> Folder:
    """The predictions folder; the one found by the layout must lie inside the dataset folder."""
    folder = Folder.of(predictions)
    if not data.predictions:
        base = Folder.of(Path(data.dir) if data.dir else predictions.parent)
        if not base.holds(str(folder.real)):
            raise UserError(
                f"{predictions}: links outside the dataset folder {base.real} (to {folder.real}); "
                "set data.predictions to read it from there"
            )
    return folder


def _name_max(folder: Path) -> int:
    """The longest file name (bytes) the predictions folder's file system takes, at most NAME_MAX."""
    try:
        limit = os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):  # no such folder yet, or no pathconf here
        return NAME_MAX
    return min(NAME_MAX, limit) if limit > 0 else NAME_MAX  # -1: no limit


# ---------------------------------------------------------------- reading files safely


def locate(path: Path, root: Folder | None = None, key: str | None = None) -> Path | None:
    """The real path of the regular file at `path`; None when nothing is there (a dangling link
    that stays inside counts as nothing). A UserError when it links outside `root`, is not a
    regular file, or cannot be looked up (a name too long, a link loop)."""
    try:
        found = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror})") from None
    unlinked = root.unlinked(path, stat.S_ISLNK(found.st_mode)) if root is not None else None
    if unlinked is not None:  # no link on the way: the lstat is the file's own
        if not stat.S_ISREG(found.st_mode):
            raise UserError(f"{path}: not a regular file")
        return Path(unlinked)
    real = os.path.realpath(path) if root is None else root.real_path(path)
    if root is not None and not root.holds(real):
        hint = f"; set {key} to read it from there" if key else ""
        raise UserError(f"{path}: links outside the dataset folder {root.real} (to {real}){hint}")
    try:
        mode = os.stat(real).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror})") from None
    if not stat.S_ISREG(mode):
        raise UserError(f"{path}: not a regular file")
    return Path(real)


def open_regular(real: Path, shown: Path) -> BinaryIO:
    """`real` (a path without links) opened for reading, refusing a link or non-regular file
    swapped in since it was checked; `shown` names it in messages."""
    try:
        fd = os.open(real, _OPEN_FLAGS)
    except OSError as exc:
        raise UserError(f"{shown}: cannot read ({exc.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UserError(f"{shown}: not a regular file")
    return os.fdopen(fd, "rb")


def read_text(path: Path, key: str, max_bytes: int | None = None, root: Folder | None = None) -> str:
    real = locate(path, root, key)
    if real is None:
        raise UserError(f"{key}: no such file: {path}")
    return _utf8(read_located(real, path, max_bytes), path)


def _utf8(raw: bytes, path: Path) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (byte {exc.start})") from None


def read_limited(
    path: Path, max_bytes: int | None, size_only: bool = False, root: Folder | None = None, key: str | None = None
) -> bytes:
    """The bytes of the regular file at `path` (b"" with `size_only`, after the size check)."""
    real = locate(path, root, key)
    if real is None:
        raise UserError(f"{path}: no such file")
    return read_located(real, path, max_bytes, size_only)


def read_located(real: Path, shown: Path, max_bytes: int | None, size_only: bool = False) -> bytes:
    """read_limited for a path `locate` returned."""
    with open_regular(real, shown) as handle:
        size = os.fstat(handle.fileno()).st_size
        if max_bytes is not None and size > max_bytes:
            raise UserError(f"{shown}: {size:,} bytes, over the {max_bytes:,} that data.max_file_mb allows")
        if size_only:
            return b""
        data = handle.read() if max_bytes is None else handle.read(max_bytes + 1)
    if max_bytes is not None and len(data) > max_bytes:  # the size on disk understated it (grew, or /proc)
        raise UserError(f"{shown}: over the {max_bytes:,} bytes that data.max_file_mb allows")
    return data


# ---------------------------------------------------------------- JSON


class BadJSON(ValueError):
    """Text that is not JSON, or JSON too deep or with integers too long to hold safely."""

    def __init__(self, why: str, line: int | None = None) -> None:
        super().__init__(why)
        self.why, self.line = why, line


def decode_json(text: str) -> object:
    """json.loads, raising BadJSON for everything hostile (never RecursionError or a bare ValueError)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadJSON(f"not JSON ({exc.msg} at column {exc.colno})", exc.lineno) from None
    except RecursionError:
        raise _too_deep(text) from None
    except ValueError as exc:  # an integer literal over sys.get_int_max_str_digits() digits
        raise BadJSON(f"not usable JSON ({str(exc).split(':')[0]})") from None
    # fewer opening brackets than the limit (strings' ones included) cannot nest past it
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and _deeper_than(value, MAX_JSON_DEPTH):
        raise _too_deep(text)
    return value


_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


def _too_deep(text: str) -> BadJSON:
    """The error, with the line where the nesting first goes too deep (strings skipped, brackets
    counted: only done once the text is known to be bad, so its cost does not matter)."""
    depth = 0
    for token in _JSON_TOKEN.finditer(text):
        depth += {"[": 1, "{": 1, "]": -1, "}": -1}.get(token.group(), 0)
        if depth > MAX_JSON_DEPTH:
            return BadJSON(
                f"not usable JSON (nested deeper than {MAX_JSON_DEPTH} levels)", text.count("\n", 0, token.start()) + 1
            )
    return BadJSON(f"not usable JSON (nested deeper than {MAX_JSON_DEPTH} levels)")


def _deeper_than(value: object, limit: int) -> bool:
    """Walked with a stack of its own: a recursive walk is what deep nesting would break."""
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def loads(text: str, path: Path, line: int | None = None) -> object:
    """JSON from a file (or from line `line` of it); a UserError naming the file and line if not."""
    try:
        return decode_json(text)
    except BadJSON as exc:
        at = line or exc.line
        raise UserError(f"{path}:{at}: {exc.why}" if at else f"{path}: {exc.why}") from None


def finite_number(obj: dict, key: str, where: str) -> float:
    """A run's score: a finite number (not a bool), or a UserError naming the key and place."""
    value = obj.get(key)
    number = math.nan
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:  # an integer literal beyond any float
            raise UserError(
                f"{where}: '{key}' must be a number (the run's score), got an integer too large for a float"
            ) from None
    if not math.isfinite(number):
        got = "missing" if key not in obj else repr(value)
        raise UserError(f"{where}: '{key}' must be a number (the run's score), got {got}")
    return number


# ---------------------------------------------------------------- results


def load_results(path: Path, max_bytes: int, root: Folder | None = None, name_max: int = NAME_MAX) -> list[Result]:
    real = locate(path, root, "data.results")
    if real is None:
        raise UserError(f"data.results: no such file: {path}")
    read_located(real, path, max_bytes, size_only=True)
    with open_regular(real, path) as handle:
        is_array = _first_byte(handle) == b"["
    rows = _json_array_rows(path, real, max_bytes, name_max) if is_array else _jsonl_rows(path, real, name_max)
    seen: dict[str, str] = {}
    results = []
    for where, label, result in rows:
        if result.id in seen:
            raise UserError(f"{where}: duplicate id {result.id!r} (first on {seen[result.id]})")
        seen[result.id] = label
        results.append(result)
    # no lines, blank lines only, or []: a dataset of zero results (the stage still logs its summary)
    return sorted(results, key=lambda r: r.id)


def _first_byte(handle: BinaryIO) -> bytes:
    """The first byte that is not whitespace (however much whitespace comes first), b"" for none."""
    while chunk := handle.read(65536):
        text = chunk.lstrip()
        if text:
            return text[:1]
    return b""


def _jsonl_rows(path: Path, real: Path, name_max: int):
    """(where, label, Result) per non-blank line, read one line at a time; binary lines end at
    \n only (JSON strings may hold U+2028 and the like, which str.splitlines would break on)."""
    source = RowFile(path, real)
    offset = 0
    with open_regular(real, path) as handle:
        for number, raw in enumerate(handle, 1):
            start, offset = offset, offset + len(raw)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise UserError(f"{path}:{number}: not UTF-8 text (byte {exc.start} of the line)") from None
            if not line.strip():
                continue
            where = f"{path}:{number}"
            row = _result(loads(line, path, number), where, name_max)
            yield where, f"line {number}", Result(row.id, row.hard, source=source, offset=start, length=len(raw))


def _json_array_rows(path: Path, real: Path, max_bytes: int, name_max: int):
    items = loads(_utf8(read_located(real, path, max_bytes), path), path)
    if not isinstance(items, list):
        raise UserError(f"{path}: expected a JSON array of results")
    # an array has no useful line numbers: name the item instead
    for number, item in enumerate(items, 1):
        where = f"{path}: item {number}"
        yield where, f"item {number}", _result(item, where, name_max)


def _result(obj: object, where: str, name_max: int = NAME_MAX) -> Result:
    if not isinstance(obj, dict):
        raise UserError(f"{where}: a result must be a JSON object, got {type(obj).__name__}")
    if "id" not in obj:
        raise UserError(f"{where}: result has no 'id'")
    return Result(id=check_id(obj["id"], where, name_max), hard=finite_number(obj, "hard", where), held=obj)


def check_id(value: object, where: str, name_max: int = NAME_MAX) -> str:
    """An id names a folder under predictions/ and a heading of the prompt: it must be one safe
    path component, short enough for a file name, on one line."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise UserError(f"{where}: 'id' must be a string, got {type(value).__name__}")
    try:
        run_id = str(value)
    except ValueError:  # an integer past sys.get_int_max_str_digits()
        raise UserError(f"{where}: id is too long (at most {name_max} bytes as a folder name)") from None
    if not run_id.strip() or run_id in (".", "..") or "/" in run_id or "\\" in run_id or _CONTROL.search(run_id):
        raise UserError(f"{where}: unsafe id {run_id!r} (it must be a single folder name on one line)")
    size = len(run_id.encode("utf-8"))
    if size > name_max:
        raise UserError(
            f"{where}: id {run_id[:40]!r}... is {size} bytes long, over the {name_max} a folder name may have"
        )
    return run_id


# ---------------------------------------------------------------- conversations


def check_conversation(path: Path, max_bytes: int, root: Folder | None = None) -> tuple[str, str] | None:
    """None when usable; ("skip", why) when missing or empty; ("bad", why) when corrupt, too large,
    linking outside `root` or not a regular file (the conversation, or an extras file beside it)."""
    try:
        real = locate(path, root)
        if real is None:
            return "skip", "missing conversation"
        for key in EXTRA_FILES:
            extra = path.parent / f"{key}.txt"
            extra_real = locate(extra, root)
            if extra_real is not None:
                read_located(extra_real, extra, max_bytes, size_only=True)
        conversation = _conversation(read_located(real, path, max_bytes), path)
    except (ValueError, UserError) as exc:
        return "bad", str(exc)
    if not conversation:
        return "skip", "empty conversation"
    return None


def parse_conversation(path: Path, max_bytes: int | None = None, root: Folder | None = None) -> list:
    """The conversation's items; ValueError naming the file when it is corrupt (UserError when it
    cannot be read at all: missing, too large, linking out, not a regular file)."""
    return _conversation(read_limited(path, max_bytes, root=root), path)


def _conversation(raw: bytes, path: Path) -> list:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    if not text.strip():
        return []
    try:
        conversation = decode_json(text)
    except BadJSON as exc:
        raise ValueError(f"{path}:{exc.line}: {exc.why}" if exc.line else f"{path}: {exc.why}") from None
    if not isinstance(conversation, list):
        raise ValueError(f"{path}: a conversation must be a JSON list, got {type(conversation).__name__}")
    return conversation


def load_trajectory(dataset: Dataset, result: Result) -> Trajectory:
    """A checked run, read again for its prompt block (files are re-checked the same way)."""
    if dataset.conversations is not None:  # read from traces: everything is in the row
        fields = result.fields
        held: dict[str, Any] = {
            "reference_text": fields.get("reference_text"),
            **{key: fields.get(key) or "" for key in EXTRA_FILES},
        }
        return Trajectory(fields=fields, conversation=dataset.conversations[result.id], extras=held)
    folder = dataset.predictions / result.id
    try:
        conversation = parse_conversation(folder / "conversation.json", dataset.max_bytes, dataset.root)
    except ValueError as exc:  # it was checked before the first call: it changed since
        raise UserError(str(exc)) from None
    fields = result.fields
    extras: dict[str, Any] = {"reference_text": fields.get("reference_text")}
    for key in EXTRA_FILES:
        value = fields.get(key)
        if not value:
            extra = folder / f"{key}.txt"
            real = locate(extra, dataset.root)
            value = read_located(real, extra, dataset.max_bytes).decode("utf-8", "replace") if real else ""
        extras[key] = value
    return Trajectory(fields=fields, conversation=conversation, extras=extras)
