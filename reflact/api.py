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
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from reflact.config import ReflactConfig
from reflact.imports import one_at_a_time
from reflact.running.outcome import WITH_PATCH

log = logging.getLogger("reflact")


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
    Raises reflact.errors.UserError for a mistake in the settings or inputs (nothing is called),
    reflact.errors.Stopped on Ctrl-C (nothing new is called, what was made is kept).
    """
    from reflact.config import from_hydra
    from reflact.running.newdir import discarded_on_mistake, first_missing

    launch = Path(launch_dir or Path.cwd()).resolve()
    cfg = compose(overrides) if config is None else with_overrides(config, overrides)
    folder = Path(run_dir).resolve() if run_dir else new_run_dir(launch)
    # a folder made here goes again when a mistake stops the run before any call
    with discarded_on_mistake(folder, first_missing(folder), {"inputs"}):
        if results is not None or skill is not None or conversations is not None:
            write_inputs(cfg, folder / "inputs", results, skill, conversations, predictions)
        elif data is not None:
            cfg.data.dir = str(Path(data).resolve())
        cfg, params = from_hydra(_structured(cfg))
        with _logging_shown():
            return run(cfg, params, folder, launch)


def run(cfg: ReflactConfig, params: dict[str, str], run_dir: Path, launch) -> Reflection:
    """The stage as an experiment, for the API and the command line (`launch` is a Path or an
    experiment.Launch): its result with the patches read back in plan order."""
    from reflact.experiment import Launch, run_experiment
    from reflact.running.rundir import RunDir

    if not isinstance(launch, Launch):
        launch = Launch(Path(launch), record_config=lambda: _record_config(cfg, run_dir))
    result = run_experiment(cfg, params, run_dir, launch)
    rd = RunDir(run_dir)
    saved = {mb["tag"]: rd.patch(mb["tag"]) for mb in result.summary["minibatches"] if mb["status"] in WITH_PATCH}
    patches = {tag: patch for tag, patch in saved.items() if patch is not None}
    return Reflection(
        patches, result.summary, result.status, result.reason, Path(run_dir), result.mlflow_run_id, result.analysis
    )


def compose(overrides: Sequence[str] = ()) -> ReflactConfig:
    """The typed config the command line would use with these overrides (`+exp=demo`, `optimizer=...`,
    `reflect.minibatch_size=4`...), composed with Hydra's compose API and then forgotten."""
    with one_at_a_time():
        from hydra import compose as hydra_compose
        from hydra import initialize_config_dir

    from reflact import config
    from reflact.shipped import conf_dir

    config.register()
    with _own_hydra(), initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        dict_cfg = hydra_compose(config_name="config", overrides=config.hydra_spelling(overrides))
    return config.typed(dict_cfg)


def with_overrides(cfg: ReflactConfig, overrides: Sequence[str]) -> ReflactConfig:
    """A copy of `cfg` with plain `key=value` overrides applied (config groups need `compose`)."""
    with one_at_a_time():
        from omegaconf import OmegaConf

    from reflact.errors import UserError

    for override in overrides:
        key = override.split("=", 1)[0]
        if "=" not in override or "." not in key.lstrip("+"):
            raise UserError(
                f"overrides: {override!r}: with a config object only key=value settings apply "
                "(for config groups such as optimizer=... pass overrides without a config)"
            )
    merged = OmegaConf.merge(_structured(cfg), OmegaConf.from_dotlist([o.lstrip("+") for o in overrides]))
    return cast(ReflactConfig, OmegaConf.to_object(merged))


def write_inputs(cfg: ReflactConfig, folder: Path, results, skill, conversations, predictions) -> None:
    """Python objects as a dataset folder inside the run dir; `cfg.data` then points at it."""
    from reflact.errors import UserError
    from reflact.files import write_json, write_text

    if results is None or skill is None or (conversations is None and predictions is None):
        raise UserError(
            "reflect(): give results, skill and conversations (or a predictions folder), or a dataset folder as `data`"
        )
    rows = list(results)
    write_text(folder / "skill.md", skill)
    write_text(folder / "results.jsonl", "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    for run_id, conversation in (conversations or {}).items():
        write_json(folder / "predictions" / str(run_id) / "conversation.json", conversation)
    cfg.data.dir = None
    cfg.data.skill, cfg.data.results = str(folder / "skill.md"), str(folder / "results.jsonl")
    cfg.data.predictions = str(Path(predictions).resolve() if predictions is not None else folder / "predictions")


def new_run_dir(launch: Path) -> Path:
    """`outputs/runs/<date>/<time>` as the command line names it, made unique within the second."""
    base = launch / "outputs" / "runs" / time.strftime("%Y-%m-%d") / time.strftime("%H-%M-%S")
    folder, n = base, 1
    while folder.exists():
        n += 1
        folder = base.with_name(f"{base.name}-{n}")
    return folder


def _record_config(cfg: ReflactConfig, run_dir: Path) -> None:
    """The settings beside the outputs, as the command line keeps them (relog reads them)."""
    with one_at_a_time():
        from omegaconf import OmegaConf

    from reflact.running.rundir import RunDir

    RunDir(run_dir).write_config(OmegaConf.to_yaml(_structured(cfg)), "[]\n")


def _structured(cfg: ReflactConfig):
    with one_at_a_time():
        from omegaconf import OmegaConf

    return OmegaConf.structured(cfg)


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
