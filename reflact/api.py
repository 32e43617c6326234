"""reflact from Python: `reflact.reflect(...)` runs the stage in-process and returns its patches.

    import reflact
    done = reflact.reflect("data/mine", overrides=["reflect.minibatch_size=4", "optimizer.model=gpt-5-mini"])
    done.patches        # {minibatch: its saved patch}, failures by index then successes
    done.summary        # what summary.json holds: settings, counts, one record per minibatch

The settings are the command line's: Hydra-style `overrides` composed from reflact's configs, or a
`ReflactConfig`. Inputs are a dataset folder, or Python objects (results, the skill, the
conversations), written into the run dir's `inputs/` so the run dir holds everything it was made
from. Nothing global is left behind (Hydra is initialised only while the config is composed, MLflow's
tracking URI is restored), so it can be called again and again in one process or a notebook.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from reflact.config import ReflactConfig, literal
from reflact.core.errors import StopSignal, UserError, user_error_message
from reflact.core.files import usable_folder
from reflact.core.imports import one_at_a_time
from reflact.core.launch import LaunchDir

log = logging.getLogger("reflact")
# Hydra's compose API works on one process-wide instance: one composition at a time
_COMPOSING = threading.Lock()


@dataclass
class Reflection:
    """What a run of the stage left: its patches, summary, status and run dir."""

    patches: dict[str, dict]  # minibatch tag -> its saved patch; failures by index, then successes
    summary: dict
    status: str  # FINISHED or FAILED (then `reason` says why and what to check)
    reason: str
    run_dir: Path
    mlflow_run_id: str | None = None
    analysis: dict | None = None  # agreement, redundancy, distinct items: what analysis.json holds


def reflect(
    data: str | Path | None = None,
    *,
    results: Iterable[dict] | None = None,
    skill: str | None = None,
    conversations: dict[str, list] | None = None,
    predictions: str | Path | None = None,
    config: ReflactConfig | None = None,
    overrides: Sequence[str] = (),
    run_dir: str | Path | None = None,
    launch_dir: str | Path | None = None,
) -> Reflection:
    """Runs the reflect stage and returns what it made.

    data: a dataset folder (skill.md, results.jsonl, predictions/<id>/conversation.json); or give
        `results` (the scored runs as dicts), `skill` (the skill's text) and the conversations, as
        `conversations` ({id: list of messages}) or a `predictions` folder.
    config / overrides: a ReflactConfig, or Hydra-style overrides of reflact's configs (those also
        apply to a given config when they are plain `key=value` settings).
    run_dir: where the run writes (an earlier run dir resumes); default a new
        `outputs/runs/<date>/<time>` under `launch_dir` (default: the current directory).
    Raises reflact.UserError for a mistake in the settings or inputs (nothing is called),
    reflact.Stopped on Ctrl-C (nothing new is called, what was made is kept).
    """
    check_arguments(data=data, predictions=predictions, run_dir=run_dir, launch_dir=launch_dir)
    launch = usable_folder(Path(launch_dir or Path.cwd()).resolve(), "launch_dir")
    # on the main thread, Ctrl-C is noted for the calls while this runs (reflact.core.errors.StopSignal)
    with StopSignal().handling(signal.SIGINT) as signals:
        cfg = compose(overrides) if config is None else with_overrides(config, overrides)
        folder = usable_folder(Path(run_dir).resolve(), "run_dir") if run_dir else LaunchDir(launch).new_run_dir()
        given = results is not None or skill is not None or conversations is not None
        inputs = python_inputs(results, skill, conversations, predictions) if given else None
        return _reflect(cfg, data, inputs, folder, launch, signals)


def _reflect(
    cfg: ReflactConfig, data, inputs: PythonInputs | None, folder: Path, launch: Path, signals: StopSignal
) -> Reflection:
    from reflact.config import from_hydra
    from reflact.orchestration.experiment import Launch
    from reflact.running.newdir import discarded_on_mistake, make
    from reflact.tracking.nesting import under_active_run

    # a folder made here goes again when a mistake stops the run before any call
    with discarded_on_mistake(make(folder, "run_dir"), {"inputs"}):
        if inputs is not None:
            inputs.write(cfg, folder / "inputs")
        elif data is not None:
            cfg.data.dir = str(Path(data).resolve())
        under_active_run(cfg.mlflow)  # inside `with mlflow.start_run():`, a child of that run
        with as_user_error():
            cfg, params = from_hydra(_structured(cfg))
        with _logging_shown(), environment_kept("MLFLOW_"):
            launched = Launch(launch, record_config=lambda: _record_config(cfg, folder), signals=signals)
            return run(cfg, params, folder, launched)


def run(cfg: ReflactConfig, params: dict[str, str], run_dir: Path, launch) -> Reflection:
    """The stage as an experiment, for the API and the command line (`launch` is a Path or an
    experiment.Launch): its result, the patches in plan order."""
    from reflact.config import parts
    from reflact.orchestration.experiment import Launch, run_experiment

    if not isinstance(launch, Launch):
        launch = Launch(Path(launch), record_config=lambda: _record_config(cfg, run_dir))
    result = run_experiment(parts(cfg), params, run_dir, launch)
    return Reflection(
        result.patches,
        result.summary,
        result.status,
        result.reason,
        Path(run_dir),
        result.mlflow_run_id,
        result.analysis,
    )


def compose(overrides: Sequence[str] = ()) -> ReflactConfig:
    """The typed config the command line would use with these overrides (`+exp=demo`, `optimizer=...`,
    `reflect.minibatch_size=4`...), composed with Hydra's compose API and then forgotten."""
    from reflact import config

    dict_cfg = composed(overrides)
    with as_user_error():
        return config.typed(dict_cfg)


def composed(overrides: Sequence[str] = ()):
    """The config as Hydra composes it from these overrides (a DictConfig, not yet typed)."""
    with one_at_a_time():
        from hydra import compose as hydra_compose
        from hydra import initialize_config_dir

    from reflact import config
    from reflact.core.shipped import conf_dir

    config.register()
    given = config.hydra_spelling(_overrides(overrides))
    with as_user_error(), _COMPOSING, _own_hydra():
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            return hydra_compose(config_name="config", overrides=given)


def with_overrides(cfg: ReflactConfig, overrides: Sequence[str]) -> ReflactConfig:
    """A copy of `cfg` with plain `key=value` overrides applied, read as the command line reads
    them (config.apply_settings: `optimizer.cache=off` is text, not YAML's false); config groups
    need `compose`."""
    with one_at_a_time():
        from omegaconf import OmegaConf

    from reflact.config import apply_settings

    if not isinstance(cfg, ReflactConfig):
        raise UserError(f"config: expected a ReflactConfig (reflact.api.compose makes one), got {type(cfg).__name__}")
    overrides = _overrides(overrides)
    for override in overrides:
        key = override.split("=", 1)[0]
        if "=" not in override or "." not in key.lstrip("+"):
            raise UserError(
                f"overrides: {override!r}: with a config object only key=value settings apply "
                "(for config groups such as optimizer=... pass overrides without a config)"
            )
    node = _structured(cfg)
    apply_settings(node, overrides, "overrides:")
    with as_user_error():
        return cast(ReflactConfig, OmegaConf.to_object(node))


@dataclass
class PythonInputs:
    """The results, skill and conversations given as Python objects, checked and serialised before
    anything is written: ids and keys meet the checks ids from files meet, so none names a path."""

    skill: str
    results_jsonl: str
    conversations: dict[str, str] = field(default_factory=dict)  # id -> conversation.json's text
    predictions: Path | None = None

    def write(self, cfg: ReflactConfig, folder: Path) -> None:
        """As a dataset folder inside the run dir; `cfg.data` then points at it."""
        from reflact.core.files import write_text

        write_text(folder / "skill.md", self.skill)
        write_text(folder / "results.jsonl", self.results_jsonl)
        for run_id, text in self.conversations.items():
            write_text(folder / "predictions" / run_id / "conversation.json", text)
        cfg.data.dir = None
        cfg.data.skill, cfg.data.results = str(folder / "skill.md"), str(folder / "results.jsonl")
        cfg.data.predictions = str(self.predictions or folder / "predictions")


def python_inputs(results, skill, conversations, predictions) -> PythonInputs:
    """The Python objects checked: a UserError names the argument, row or key at fault."""
    if results is None or skill is None or (conversations is None and predictions is None):
        raise UserError(
            "reflect(): give results, skill and conversations (or a predictions folder), or a dataset folder as `data`"
        )
    if not isinstance(skill, str):
        raise UserError(f"reflect(): skill must be text (str), got {type(skill).__name__}")
    if isinstance(results, (str, bytes, dict)) or not isinstance(results, Iterable):
        raise UserError(f"reflect(): results must be a list of dicts, got {type(results).__name__}")
    lines = [_json_line(row, f"results[{n}]") for n, row in enumerate(results)]
    given = Path(predictions).resolve() if predictions is not None else None
    return PythonInputs(skill, "".join(lines), _conversations(conversations), given)


def _conversations(conversations) -> dict[str, str]:
    from reflact.inputs.dataset import check_id

    if conversations is None:
        return {}
    if not isinstance(conversations, dict):
        got = type(conversations).__name__
        raise UserError(f"reflect(): conversations must be a dict of id -> messages, got {got}")
    texts: dict[str, str] = {}
    for key, conversation in conversations.items():
        run_id = check_id(key, f"reflect(): conversations key {str(key)[:60]!r}")
        if run_id in texts:
            raise UserError(f"reflect(): conversations: the id {run_id!r} is given twice")
        texts[run_id] = _json_text(conversation, f"conversations[{run_id!r}]", indent=2)
    return texts


def _json_line(row: object, where: str) -> str:
    if not isinstance(row, dict):
        raise UserError(f"reflect(): {where} must be a dict, got {type(row).__name__}")
    return _json_text(row, where) + "\n"


def _json_text(value: object, where: str, indent: int | None = None) -> str:
    """JSON of plain Python values only: a numpy number, bytes or NaN is the caller's to convert."""
    try:
        return json.dumps(value, ensure_ascii=False, indent=indent, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        why = " ".join(str(exc).split())[:120]
        raise UserError(f"reflect(): {where} is not plain JSON data ({why}); use str, int, float, list, dict") from None


def check_arguments(**paths: object) -> None:
    """Path arguments: a str or a path, not empty (None: not given)."""
    for name, value in paths.items():
        if value is None:
            continue
        if not isinstance(value, (str, os.PathLike)) or not str(os.fspath(value)).strip():
            raise UserError(f"reflect(): {name} must be a folder's path, got {_shown(value)}")


def _overrides(overrides: object) -> list[str]:
    if isinstance(overrides, (str, bytes)) or not all(isinstance(o, str) for o in cast(Iterable, overrides)):
        raise UserError('overrides must be a list of "key=value" strings')
    return list(cast(Iterable[str], overrides))


def _shown(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}" if not isinstance(value, str) else "an empty text"


@contextlib.contextmanager
def as_user_error() -> Iterator[None]:
    """Hydra's and OmegaConf's complaints about the settings, as the one-line UserError."""
    try:
        yield
    except UserError:
        raise
    except Exception as exc:
        message = user_error_message(exc)
        if message is None:
            raise
        raise UserError(message) from None


def _record_config(cfg: ReflactConfig, run_dir: Path) -> None:
    """The settings beside the outputs, as the command line keeps them (relog reads them)."""
    with one_at_a_time():
        from omegaconf import OmegaConf

    from reflact.running.rundir import RunDir

    RunDir(run_dir).write_config(OmegaConf.to_yaml(_structured(cfg)), "[]\n")


def _structured(cfg: ReflactConfig):
    """The config as OmegaConf's node, its texts literal: a `${` a caller wrote is data, never interpolated."""
    with one_at_a_time():
        from omegaconf import OmegaConf

    with as_user_error():
        return OmegaConf.structured(literal(cfg))


@contextlib.contextmanager
def _own_hydra():
    """Hydra's compose API needs its global state free: set aside an outer app's (a Hydra job
    calling reflect) while composing, and give it back."""
    with one_at_a_time():
        from hydra.core.global_hydra import GlobalHydra

    saved = GlobalHydra.instance().hydra
    GlobalHydra.instance().hydra = None
    try:
        yield
    finally:  # Hydra's initialize swaps in a copy of the singleton on exit: restore on that one
        GlobalHydra.instance().hydra = saved


@contextlib.contextmanager
def _logging_shown():
    """Progress lines on stderr while the stage runs, unless the caller set up logging."""
    if logging.getLogger().handlers or log.handlers:
        yield
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    level = log.level
    log.setLevel(logging.INFO)
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


@dataclass
class _KeptEnvironment:
    """Variables under a prefix as they were before the first of the calls running now: MLflow's
    settings reflact sets while tracking go again when the last call ends (not while another runs)."""

    prefix: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    running: int = 0
    before: dict[str, str] = field(default_factory=dict)

    def enter(self) -> None:
        with self.lock:
            if self.running == 0:
                self.before = {k: v for k, v in os.environ.items() if k.startswith(self.prefix)}
            self.running += 1

    def leave(self) -> None:
        with self.lock:
            self.running -= 1
            if self.running:
                return
            for name in [k for k in os.environ if k.startswith(self.prefix) and k not in self.before]:
                del os.environ[name]
            os.environ.update(self.before)


_KEPT = {"MLFLOW_": _KeptEnvironment("MLFLOW_")}


@contextlib.contextmanager
def environment_kept(prefix: str) -> Iterator[None]:
    kept = _KEPT[prefix]
    kept.enter()
    try:
        yield
    finally:
        kept.leave()
