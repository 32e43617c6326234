"""A finished run dir's records as the tools that read them afterwards (analyze, relog, the sweep
report) need them, checked: a record damaged on disk (edited by hand, cut short, from another
version) is a one-line UserError naming the run dir and the field, never a traceback deep inside.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

from reflact.calls.protocol import Usage
from reflact.errors import UserError
from reflact.imports import one_at_a_time
from reflact.running.outcome import Outcome
from reflact.running.rundir import SUMMARY, RunDir

# what a minibatch's record (an Outcome) holds in each field, read off the dataclass's types
_KIND = {name: typing.get_origin(kind) or kind for name, kind in typing.get_type_hints(Outcome).items()}
_USAGE = tuple(f.name for f in fields(Usage))
_CHECKS: dict[object, tuple[Callable[[object], bool], str]] = {  # kind -> (does a value fit, what it should be)
    str: (lambda v: isinstance(v, str), "a text"),
    int: (lambda v: _integer(v), "an integer"),
    float: (lambda v: v is None or _number(v), "a number"),  # null: unknown (a cost without a price)
    list: (lambda v: isinstance(v, list), "a list"),
}


def finished_summary(root: Path) -> dict:
    """The run dir's summary.json, of the shape the stage writes; a UserError names what is wrong."""
    summary = RunDir(root).summary()
    if summary is None or not isinstance(summary.get("minibatches"), list):
        raise UserError(f"{root}: not a finished run dir (no readable {SUMMARY})")
    where = f"{root / SUMMARY}"
    for key in ("settings", "counts"):
        if not isinstance(summary.get(key), dict):
            raise UserError(f"{where}: damaged ('{key}' is not an object)")
    for number, record in enumerate(summary["minibatches"]):
        _check_minibatch(record, f"{where}: minibatches[{number}]")
    _check_optional_numbers(summary["counts"], ("cost_usd", "spent_usd", "support_share"), f"{where}: counts")
    times = summary.get("times", {})
    if not isinstance(times, dict):
        raise UserError(f"{where}: damaged ('times' is not an object)")
    for key in ("started_at", "ended_at"):  # seconds since the epoch, when recorded
        if key in times and not _number(times[key]):
            raise UserError(f"{where}: times.{key} is damaged (got {_shown(times[key])}, not a number)")
    for key in ("seed", "samples", "minibatch_size", "edit_budget"):
        value = summary["settings"].get(key)
        if value is not None and not _integer(value):
            raise UserError(f"{where}: settings.{key} is damaged (got {_shown(value)}, not an integer)")
    return summary


def _check_minibatch(record: object, where: str) -> None:
    if not isinstance(record, dict):
        raise UserError(f"{where}: damaged (not an object)")
    for key in ("tag", "group", "index", "status"):
        if key not in record:
            raise UserError(f"{where}: damaged (no '{key}')")
    for key, value in record.items():
        check = _CHECKS.get(_KIND.get(key))
        if check is not None and not check[0](value):
            raise UserError(f"{where}.{key} is damaged (got {_shown(value)}, not {check[1]})")
    usage = record.get("usage", {})
    if not isinstance(usage, dict) or not all(k in _USAGE and _integer(v) for k, v in usage.items()):
        raise UserError(f"{where}.usage is damaged (token counts {', '.join(_USAGE)} expected)")


def _check_optional_numbers(record: dict, keys: tuple[str, ...], where: str) -> None:
    for key in keys:
        value = record.get(key)
        if value is not None and not _number(value):
            raise UserError(f"{where}.{key} is damaged (got {_shown(value)}, not a number)")


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def saved_yaml(path: Path):
    """A run's saved YAML (.hydra/config.yaml, hydra.yaml) as OmegaConf reads it, a mapping; a
    UserError names the file when it cannot be read as one."""
    with one_at_a_time():
        from omegaconf import DictConfig, OmegaConf

    try:
        loaded = OmegaConf.load(path)
    except Exception as exc:  # YAML's parser errors, an unreadable file, text that is not UTF-8
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"{path}: not a readable YAML config ({first[:120]})") from None
    if not isinstance(loaded, DictConfig):
        raise UserError(f"{path}: damaged (a YAML mapping of settings expected)")
    return loaded
