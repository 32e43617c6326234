"""A finished run dir's records as the tools that read them afterwards (analyze, relog, the sweep
report) need them, checked: a record damaged on disk (edited by hand, cut short, from another
version) is a one-line UserError naming the run dir and the field, never a traceback deep inside.
Every name a record gives a minibatch must be a plan tag (files are named after it), every number
a finite one in a sane range, and saved YAML holds no alias (a few lines of them expand to billions
of nodes).
"""

from __future__ import annotations

import io
import re
import typing
from collections.abc import Callable, Iterator
from dataclasses import fields
from pathlib import Path

from reflact.calls.protocol import Usage
from reflact.core.errors import UserError
from reflact.core.groups import GROUPS
from reflact.core.imports import one_at_a_time
from reflact.core.text import shown
from reflact.prompting.plan import is_tag, parse_tag
from reflact.running.outcome import Outcome
from reflact.running.rundir import ANALYSIS, KEPT_ITEMS, LARGEST, LATEST, SUMMARY, RunDir

# what a minibatch's record (an Outcome) holds in each field, read off the dataclass's types
_KIND = {name: typing.get_origin(kind) or kind for name, kind in typing.get_type_hints(Outcome).items()}
_USAGE = tuple(f.name for f in fields(Usage))
# the counts a run's status is decided from (reflact.running.summary.run_status)
_STATUS_COUNTS = ("minibatches", *(f"minibatches_{s}" for s in ("done", "reused", "failed", "skipped", "not_run")))
# a saved config's interpolations at most: a few in any real one. Each may name a value holding more,
# so n of them can make OmegaConf resolve 3^(n/3) times: 20 take well under a second, 30 some 20 s
INTERPOLATIONS = 20
_INTERPOLATION = re.compile(r"(?<!\\)(?:\\\\)*\$\{")  # `${` not escaped (an even run of backslashes before it)
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
    _check_counts(summary["counts"], f"{where}: counts")
    _check_times(summary.get("times", {}), where)
    _check_settings(summary["settings"], f"{where}: settings")
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
            raise UserError(f"{where}.{key} is damaged (got {shown(value)}, not {check[1]})")
    named = parse_tag(record["tag"]) if is_tag(record["tag"]) else None
    if named is None or named[:2] != (record["group"], record["index"]):
        raise UserError(f"{where}.tag is damaged (got {shown(record['tag'])}, not the plan tag of its group and index)")
    usage = record.get("usage", {})
    if not isinstance(usage, dict) or not set(usage) <= set(_USAGE) or not all(map(_count, usage.values())):
        raise UserError(f"{where}.usage is damaged (token counts {', '.join(_USAGE)} expected)")
    apply = record.get("apply", {})
    if not isinstance(apply, dict) or (apply and not _number(apply.get("apply_share"))):
        raise UserError(f"{where}.apply is damaged (apply counts with a number apply_share expected)")


def _check_counts(counts: dict, where: str) -> None:
    """Every count a number (null: a cost without a price)."""
    for key, value in counts.items():
        if value is not None and not _number(value):
            raise UserError(f"{where}.{key} is damaged (got {shown(value)}, not a number)")


def loggable_summary(root: Path) -> dict:
    """finished_summary, with what a run's MLflow record needs beyond what analyze does: the counts
    its status is decided from and every minibatch's every token count."""
    summary = finished_summary(root)
    where = f"{root / SUMMARY}"
    for key in _STATUS_COUNTS:
        if not _count(summary["counts"].get(key)):
            raise UserError(f"{where}: counts.{key} is damaged (got {shown(summary['counts'].get(key))}, not a count)")
    for number, record in enumerate(summary["minibatches"]):
        if set(record.get("usage", {})) != set(_USAGE):
            raise UserError(
                f"{where}: minibatches[{number}].usage is damaged (token counts {', '.join(_USAGE)} expected)"
            )
    return summary


def _check_times(times: object, where: str) -> None:
    if not isinstance(times, dict):
        raise UserError(f"{where}: damaged ('times' is not an object)")
    for key in ("started_at", "ended_at"):  # seconds since the epoch, when recorded
        if key in times and not _epoch(times[key]):
            raise UserError(f"{where}: times.{key} is damaged (got {shown(times[key])}, not a time)")


def _check_settings(settings: dict, where: str) -> None:
    for key in ("seed", "samples", "minibatch_size", "edit_budget"):
        value = settings.get(key)
        if value is not None and not _integer(value):
            raise UserError(f"{where}.{key} is damaged (got {shown(value)}, not an integer)")
    hashes = settings.get("template_hashes")
    groups = {group.name for group in GROUPS}
    if hashes is not None and not (
        isinstance(hashes, dict) and all(k in groups and isinstance(v, str) for k, v in hashes.items())
    ):
        raise UserError(f"{where}.template_hashes is damaged (a text per group expected)")


def checked_analysis(root: Path) -> dict | None:
    """The run's analysis.json as relog logs it, None when the run has none; a UserError names
    what is damaged (a figure that is no number, a minibatch that is no plan tag)."""
    path = root / ANALYSIS
    if not path.exists():
        return None
    analysis = RunDir(root).analysis()
    if analysis is None:
        raise UserError(f"{path}: damaged (not a JSON object)")
    for key, value in analysis.items():
        if isinstance(value, (int, float)) and not _number(value):
            raise UserError(f"{path}: {key} is damaged (got {shown(value)}, not a number)")
    minibatches = analysis.get("minibatches", [])
    if not isinstance(minibatches, list):
        raise UserError(f"{path}: damaged ('minibatches' is not a list)")
    for number, record in enumerate(minibatches):
        agreement = record.get("agreement") if isinstance(record, dict) else None
        if (
            not isinstance(record, dict)
            or not is_tag(record.get("minibatch"))
            or not (agreement is None or _number(agreement))
        ):
            raise UserError(f"{path}: minibatches[{number}] is damaged (a plan tag and an agreement expected)")
    return analysis


def check_kept_items(root: Path) -> None:
    """Every line of kept_items.jsonl a kept item as relog's table takes it; a UserError names the
    first that is not."""
    path = root / KEPT_ITEMS
    number = 0
    try:
        for number, row in enumerate(RunDir(root).kept_items(), 1):
            if not _kept_item_ok(row):
                raise UserError(f"{path}: line {number} is damaged (not a kept item)")
    except (ValueError, RecursionError):  # not JSON (or not UTF-8), or nested deeper than json reads
        raise UserError(f"{path}: line {number + 1} is damaged (not a JSON object)") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot be read ({exc.strerror or exc})") from None


def _kept_item_ok(row: object) -> bool:
    return (
        isinstance(row, dict)
        and is_tag(row.get("minibatch"))
        and _count(row.get("position"))
        and isinstance(row.get("trajectory_ids"), list)
        and all(isinstance(i, str) for i in row["trajectory_ids"])
        and "item" in row
        and isinstance(row.get("apply", {}), dict)
    )


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -LARGEST <= value <= LARGEST


def _count(value: object) -> bool:
    return _integer(value) and value >= 0  # type: ignore[operator]


def _number(value: object) -> bool:
    """A finite number in a sane range (NaN fails every comparison)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and -LARGEST <= value <= LARGEST


def _epoch(value: object) -> bool:
    return _number(value) and 0 <= value <= LATEST  # type: ignore[operator]


def saved_yaml(path: Path):
    """A run's saved YAML (.hydra/config.yaml, hydra.yaml) as OmegaConf reads it, a mapping; a
    UserError names the file when it cannot be read as one, or holds an alias (reflact writes
    none, and a few lines of them expand to billions of nodes before OmegaConf could refuse them)."""
    with one_at_a_time():
        from omegaconf import DictConfig, OmegaConf

    try:
        text = path.read_text(encoding="utf-8")
        _refuse_aliases(text, path)
        loaded = OmegaConf.load(io.StringIO(text))
    except UserError:
        raise
    except Exception as exc:  # YAML's parser errors, an unreadable file, text that is not UTF-8
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"{path}: not a readable YAML config ({first[:120]})") from None
    if not isinstance(loaded, DictConfig):
        raise UserError(f"{path}: damaged (a YAML mapping of settings expected)")
    return loaded


def _refuse_aliases(text: str, path: Path) -> None:
    """The YAML's events, one pass, no node built: an alias is refused where it stands."""
    with one_at_a_time():
        import yaml  # PyYAML: OmegaConf's own parser

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, yaml.AliasEvent):
            line = event.start_mark.line + 1 if event.start_mark is not None else "?"
            raise UserError(f"{path}: line {line} holds a YAML alias (*{event.anchor}); reflact writes none")


def saved_config(path: Path):
    """A run's saved .hydra/config.yaml as saved_yaml reads it, to be resolved into settings: with
    at most INTERPOLATIONS interpolations, so that resolving it ends (a UserError names the file)."""
    with one_at_a_time():
        from omegaconf import OmegaConf

    loaded = saved_yaml(path)
    found = sum(len(_INTERPOLATION.findall(text)) for text in _texts(OmegaConf.to_container(loaded, resolve=False)))
    if found > INTERPOLATIONS:
        raise UserError(
            f"{path}: damaged ({found} interpolations; a saved config holds a few, and is read with at most "
            f"{INTERPOLATIONS})"
        )
    return loaded


def _texts(value: object) -> Iterator[str]:
    """Every text in a YAML document's values, depth first."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _texts(item)
    elif isinstance(value, list):
        for item in value:
            yield from _texts(item)


def saved_hydra(path: Path) -> tuple[bool, tuple[str, ...], int | None]:
    """(whether the run was a job of a multirun, the command line's overrides, the job's number)
    from a run's saved hydra.yaml, as written (nothing in it is interpolated); a UserError names
    what is damaged."""
    with one_at_a_time():
        from omegaconf import OmegaConf

    saved = OmegaConf.to_container(saved_yaml(path), resolve=False)
    hydra = saved.get("hydra") if isinstance(saved, dict) else None
    overrides = hydra.get("overrides") if isinstance(hydra, dict) else None
    job = hydra.get("job") if isinstance(hydra, dict) else None
    task = overrides.get("task") if isinstance(overrides, dict) else None
    if not isinstance(hydra, dict) or not isinstance(task, list) or not all(isinstance(o, str) for o in task):
        raise UserError(f"{path}: damaged (hydra.overrides.task, a list of overrides, expected)")
    multirun = hydra.get("mode") == "MULTIRUN"
    number = job.get("num") if isinstance(job, dict) else None
    if multirun and not _count(number):
        raise UserError(f"{path}: damaged (hydra.job.num of a multirun's job is {shown(number)}, not a count)")
    return multirun, tuple(task), number if multirun else None
