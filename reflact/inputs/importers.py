"""Turn agent logs into a reflact dataset folder (SPEC 1 layout).

    python -m reflact.importers taubench results.json data/tau
    python -m reflact.importers chat_jsonl runs.jsonl data/chat

The whole input is read and checked before anything is written, and results.jsonl is written
last, so a folder that has a results.jsonl is a complete import. Heavy modules are imported
only when converting, so `--help` stays fast.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path

from reflact.core.errors import UserError, exits_on_user_error
from reflact.core.files import write_text
from reflact.core.groups import failed

FORMATS = ("taubench", "chat_jsonl")
TAU_TASK_TYPE = "tau-bench"
LEGACY_CALL = object()  # the pending key of a legacy `function_call`, answered by a "function" message


@dataclass
class Run:
    """One converted run: its results.jsonl line, its trajectory, the system prompt it saw."""

    result: dict
    conversation: list
    system: str | None
    where: str  # file and line or item, for messages about this run

    @property
    def id(self) -> str:
        return self.result["id"]


@dataclass
class Imported:
    skill: str
    runs: list[Run]
    warnings: list[str] = field(default_factory=list)


@dataclass
class Converted:
    """A chat transcript as a SPEC 1.2 conversation, plus what the result line needs from it."""

    items: list = field(default_factory=list)
    system: str | None = None
    first_user: str | None = None
    n_assistant: int = 0
    started: bool = False  # a non-system message was seen: later system messages are not the prompt


# ---------------------------------------------------------------- messages -> conversation


def convert_messages(messages: object, where: str) -> Converted:
    """OpenAI chat messages to conversation items; tool calls are paired with their replies.

    Replies are matched by tool_call_id to the oldest unanswered call with that id, because
    some logs (tau-bench's among them) reuse call ids within one transcript.
    """
    if not isinstance(messages, list):
        raise UserError(f"{where}: expected a list of chat messages, got {type(messages).__name__}")
    out = Converted()
    pending: dict[object, deque] = {}
    for number, message in enumerate(messages, 1):
        _convert_one(message, f"{where}, message {number}", out, pending)
    return out


def _convert_one(message: object, where: str, out: Converted, pending: dict) -> None:
    if not isinstance(message, dict):
        raise UserError(f"{where}: a message must be a JSON object, got {type(message).__name__}")
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise UserError(f"{where}: message has no 'role'")
    content = message_text(message.get("content"))
    if role == "system" and not out.started:
        # the leading system message(s): the skill, not repeated in the trajectory
        out.system = content if out.system is None else f"{out.system}\n\n{content}"
        return
    out.started = True
    if role == "system":
        # a system message mid-run is not evaluator output: keep it under a role that does
        # not render as [verification]
        out.items.append({"role": "system_note", "content": content})
    elif role == "assistant":
        _assistant(message, content, where, out, pending)
    elif role in ("tool", "function"):
        _tool_reply(message, role, content, out, pending)
    else:
        if role == "user" and out.first_user is None:
            out.first_user = content
        out.items.append({"role": role, "content": content})


def _assistant(message: dict, content: str, where: str, out: Converted, pending: dict) -> None:
    """Its text (if any), then one tool_call item per call, waiting for its reply's obs."""
    out.n_assistant += 1
    if content.strip():
        out.items.append({"role": "assistant", "content": content})
    for key, cmd in _calls(message, where):
        item = {"type": "tool_call", "cmd": cmd, "obs": ""}
        out.items.append(item)
        pending.setdefault(key, deque()).append(item)


def _tool_reply(message: dict, role: str, content: str, out: Converted, pending: dict) -> None:
    """Fill the waiting call's obs; a reply to no known call is kept as its own item."""
    key = _call_key(message.get("tool_call_id")) if role == "tool" else LEGACY_CALL
    waiting = pending.get(key)
    if waiting:
        waiting.popleft()["obs"] = content
    else:
        out.items.append({"role": role, "content": content})


def _call_key(call_id: object) -> str:
    """A hashable key for any JSON id (ids are strings in practice, but logs vary)."""
    return call_id if isinstance(call_id, str) else json.dumps(call_id)


def _calls(message: dict, where: str) -> list[tuple[object, str]]:
    """(call id, "name(arguments)") for each tool call, and for a legacy `function_call`."""
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise UserError(f"{where}: 'tool_calls' must be a list")
    found: list[tuple[object, str]] = []
    for number, call in enumerate(calls, 1):
        if not isinstance(call, dict):
            raise UserError(f"{where}, tool call {number}: expected an object")
        found.append((_call_key(call.get("id")), _cmd(call.get("function"), f"{where}, tool call {number}")))
    legacy = message.get("function_call")
    if legacy:
        found.append((LEGACY_CALL, _cmd(legacy, f"{where}, function_call")))
    return found


def _cmd(function: object, where: str) -> str:
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise UserError(f"{where}: tool call has no function name")
    arguments = function.get("arguments")
    if arguments is None:
        arguments = ""
    elif not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return f"{function['name']}({arguments})"


def message_text(content: object) -> str:
    """Message content as text: null is empty, a list of parts joins its text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [part.get("text", "") if isinstance(part, dict) else str(part) for part in content]
        return "\n".join(part for part in parts if isinstance(part, str) and part)
    return json.dumps(content, ensure_ascii=False)


# ---------------------------------------------------------------- reading the inputs


def jsonl_lines(text: str):
    """(line number, line) of the non-blank lines; only \n ends a line (JSON strings may hold
    U+2028 and the like, which str.splitlines would break on)."""
    return ((n, line) for n, line in enumerate(text.split("\n"), 1) if line.strip())


def load_taubench(path: Path) -> Imported:
    """tau-bench result files: a JSON list of {task_id, trial, reward, info, traj}."""
    from reflact.inputs.dataset import check_id, finite_number, loads, read_text

    items = loads(read_text(path, "input"), path)
    if not isinstance(items, list):
        raise UserError(f"{path}: expected a JSON list of tau-bench runs, got {type(items).__name__}")
    runs = []
    trials_seen: Counter = Counter()
    for number, item in enumerate(items, 1):
        where = f"{path}: item {number}"
        if not isinstance(item, dict):
            raise UserError(f"{where}: a run must be a JSON object, got {type(item).__name__}")
        task_id = _id_part(item, "task_id", where)
        trial = item.get("trial")
        if trial is None:
            trial = trials_seen[task_id]  # files without trials: the k-th run of a task is trial k
        else:
            trial = _id_part(item, "trial", where)
        trials_seen[task_id] += 1
        run_id = check_id(f"task{task_id}_trial{trial}", where)
        hard = finite_number(item, "reward", where)
        if "traj" not in item:
            raise UserError(f"{where}: run has no 'traj'")
        converted = convert_messages(item["traj"], f"{where}, traj")
        result = {
            "id": run_id,
            "hard": hard,
            "task_description": converted.first_user or _instruction(item.get("info")),
            "task_type": TAU_TASK_TYPE,
            "n_turns": converted.n_assistant,
            "info": item.get("info"),
        }
        runs.append(Run(result, converted.items, converted.system, where))
    return _finish(path, runs, _most_common_system(runs))


def _id_part(item: dict, key: str, where: str) -> str:
    if key not in item:
        raise UserError(f"{where}: run has no '{key}'")
    value = item[key]
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise UserError(f"{where}: '{key}' must be an integer or a string, got {value!r}")
    return str(value)


def _instruction(info: object) -> str:
    """tau-bench's user-simulator instruction, for a run whose transcript has no user turn."""
    task = info.get("task") if isinstance(info, dict) else None
    instruction = task.get("instruction") if isinstance(task, dict) else None
    return instruction if isinstance(instruction, str) else ""


def _most_common_system(runs: list[Run]) -> str | None:
    counts = Counter(run.system for run in runs if run.system is not None)
    return counts.most_common(1)[0][0] if counts else None  # ties: the first one seen


def load_chat_jsonl(path: Path) -> Imported:
    """One run per line: {"id"?, "messages", "score", "task"?}; other keys are kept."""
    from reflact.inputs.dataset import check_id, finite_number, loads, read_text

    runs = []
    for line_number, line in jsonl_lines(read_text(path, "input")):
        where = f"{path}:{line_number}"
        obj = loads(line, path, line_number)
        if not isinstance(obj, dict):
            raise UserError(f"{where}: a run must be a JSON object, got {type(obj).__name__}")
        run_id = check_id(obj["id"], where) if "id" in obj else f"run_{line_number}"
        hard = finite_number(obj, "score", where)
        if "messages" not in obj:
            raise UserError(f"{where}: run has no 'messages'")
        converted = convert_messages(obj["messages"], where)
        result = {k: v for k, v in obj.items() if k not in ("id", "messages", "score", "task", "hard")}
        task = obj.get("task")
        if not isinstance(task, str):
            task = result.get("task_description") or converted.first_user or ""
        result.update(id=run_id, hard=hard, task_description=task, n_turns=converted.n_assistant)
        runs.append(Run(result, converted.items, converted.system, where))
    skill = runs[0].system if runs else None
    return _finish(path, runs, skill)


def _finish(path: Path, runs: list[Run], skill: str | None) -> Imported:
    """Checks shared by the formats; runs whose system prompt is not the skill keep theirs."""
    if not runs:
        raise UserError(f"{path}: no runs in the file")
    seen: dict[str, str] = {}
    for run in runs:
        if run.id in seen:
            raise UserError(f"{run.where}: duplicate id {run.id!r} (first at {seen[run.id]})")
        seen[run.id] = run.where
    warnings = []
    if skill is None:
        warnings.append(f"{path}: no system message found; skill.md is empty")
    differing = [run for run in runs if run.system is not None and run.system != skill]
    for run in differing:
        run.result["target_system_prompt"] = run.system
    if differing:
        warnings.append(
            f"{path}: {len(differing)} of {len(runs)} runs have a different system message than "
            "skill.md; each keeps its own as target_system_prompt"
        )
    return Imported(skill=skill or "", runs=runs, warnings=warnings)


LOADERS = {"taubench": load_taubench, "chat_jsonl": load_chat_jsonl}


# ---------------------------------------------------------------- writing the dataset


def check_output(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: exists and is not a folder")
    if (out / "results.jsonl").exists() and not force:
        raise UserError(f"{out}: already holds a dataset (results.jsonl); pass --force to overwrite it")


def write_dataset(imported: Imported, out: Path, max_file_mb: float | None = None) -> None:
    """Conversations first, results.jsonl last: its presence marks a complete import. Every file is
    made in memory first: one reflact would refuse to read (over `max_file_mb`, data.max_file_mb's
    default when None) stops the import before anything is written."""
    conversations = [
        (out / "predictions" / run.id / "conversation.json", json.dumps(run.conversation, ensure_ascii=False, indent=2))
        for run in imported.runs
    ]
    results = "".join(json.dumps(run.result, ensure_ascii=False) + "\n" for run in imported.runs)
    _check_sizes([*conversations, (out / "results.jsonl", results)], max_file_mb)
    try:
        for path, text in conversations:
            write_text(path, text + "\n")
        write_text(out / "skill.md", imported.skill)
        write_text(out / "results.jsonl", results)
    except OSError as exc:
        raise UserError(f"{exc.filename or out}: cannot write ({exc.strerror})") from None


def _check_sizes(files: list[tuple[Path, str]], max_file_mb: float | None) -> None:
    from reflact.config import DataConfig

    limit_mb = DataConfig().max_file_mb if max_file_mb is None else max_file_mb
    for path, text in files:
        size = len(text.encode("utf-8", "surrogatepass")) + 1
        if size > limit_mb * 1024 * 1024:
            raise UserError(
                f"{path}: would be {size / 1024 / 1024:.1f} MB, over the {limit_mb:g} MB reflact reads "
                "(data.max_file_mb); nothing was written: pass --max-file-mb N here and data.max_file_mb=N "
                "to the run, or import fewer runs"
            )


def import_runs(fmt: str, source: Path, out: Path, force: bool = False, max_file_mb: float | None = None) -> Imported:
    """Read `source` in format `fmt` and write the dataset folder `out`."""
    if fmt not in LOADERS:
        raise UserError(f"unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
    if max_file_mb is not None and not (math.isfinite(max_file_mb) and max_file_mb > 0):
        raise UserError(f"--max-file-mb must be a positive number, got {max_file_mb}")
    check_output(out, force)
    imported = LOADERS[fmt](source)
    write_dataset(imported, out, max_file_mb)
    return imported


def summary(imported: Imported, out: Path) -> str:
    from reflact.config import ReflectConfig

    threshold = ReflectConfig().success_threshold  # the stage's default failure rule
    failures = sum(1 for run in imported.runs if failed(run.result["hard"], threshold))
    successes = len(imported.runs) - failures
    return f"reflact: wrote {len(imported.runs)} runs to {out} ({failures} failures, {successes} successes)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m reflact.importers",
        description="Turn agent logs into a reflact dataset folder (skill.md, results.jsonl, predictions/).",
    )
    parser.add_argument(
        "format",
        choices=FORMATS,
        help="taubench: a tau-bench results JSON list; chat_jsonl: one {id?, messages, score, task?} per line",
    )
    parser.add_argument("input", type=Path, help="the log file to read")
    parser.add_argument("dataset_dir", type=Path, help="the dataset folder to write")
    parser.add_argument("--force", action="store_true", help="overwrite a folder that already has a results.jsonl")
    parser.add_argument(
        "--max-file-mb",
        type=float,
        default=None,
        help="the largest file to write, as data.max_file_mb of the runs that will read it (default: its default, 64)",
    )
    return parser


@exits_on_user_error
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    imported = import_runs(args.format, args.input, args.dataset_dir, args.force, args.max_file_mb)
    for warning in imported.warnings:
        print(f"reflact: warning: {warning}", file=sys.stderr)
    print(summary(imported, args.dataset_dir))
    return 0
