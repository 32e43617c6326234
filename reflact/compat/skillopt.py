"""SkillOpt's reflect stage, run by reflact.

One line makes SkillOpt's own trainer reflect with reflact, with no change to SkillOpt:

    reflact.compat.skillopt.install()

It sets the module attribute `skillopt.gradient.reflect.run_minibatch_reflect` (and the package's
re-export `skillopt.gradient.run_minibatch_reflect`) to this module's `run_minibatch_reflect`: the
function-local import in `skillopt.envs.base.EnvAdapter.reflect`, which every built-in adapter
inherits, then finds reflact. Nothing else in SkillOpt changes; `uninstall()` puts SkillOpt's own
function back, and `with installed(): ...` does both around a block. Code that calls
`run_minibatch_reflect` itself imports it from here instead.

It takes the reference implementation's arguments (skillopt 0.2.0), returns its return shape, a
list of raw patch dicts, and writes them as `minibatch_fail_NNN.json` / `minibatch_succ_NNN.json`
into `patches_dir`, where SkillOpt's trainer reads them, byte for byte as SkillOpt's reflect writes
them for the same replies (reflact.compat.skillopt_patches), so every file the trainer writes is too.
What the caller does not pass is read where SkillOpt's own reflect reads it
(reflact.compat.skillopt_settings): the optimizer's endpoint, model, auth mode and key variable,
`reasoning_effort`, the skill-aware switch and appendix source.
OPENAI_BASE_URL, when set, names the server instead; a `config` replaces all of them. The analyst
calls count in SkillOpt's token tracker, under its stage `analyst`, as its own reflect's do.

reflact's own record of the run (prompts, replies, outcomes, summary, MLflow run) goes to
`<patches_dir>.reflact/`, which a rerun resumes from; unless configured, the response cache and
the MLflow store are in its `outputs/` (`cache.db`, `mlflow.db`, `mlartifacts/`), so nothing is
written into the trainer's working directory. Where reflact deliberately differs from the reference (sorted input,
stricter parsing and re-asks, fenced trajectories, deterministic order, a support count per
patch with `support_counts=True`): see docs/skillopt.md.
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
from collections.abc import Sequence
from pathlib import Path

from reflact.compat import skillopt_settings
from reflact.compat.skillopt_patches import Shape, as_skillopt, as_text
from reflact.config import AppendixSource, ReflactConfig, SkillAwareConfig
from reflact.core.errors import UserError
from reflact.core.files import write_text
from reflact.core.imports import one_at_a_time

# on SkillOpt's module: its own function, kept by install(); on reflact's installed function: True
REPLACED = "_reflact_replaced"


def run_minibatch_reflect(
    results: list[dict],
    skill_content: str,
    prediction_dir: str,
    patches_dir: str,
    workers: int,
    failure_only: bool,
    minibatch_size: int = 8,
    edit_budget: int = 4,
    random_seed: int | None = None,
    *,
    error_system: str | None = None,
    success_system: str | None = None,
    rejection_context: str = "",
    trajectory_memory_context: str = "",
    step_buffer_context: str = "",
    meta_skill_context: str = "",
    update_mode: str = "patch",
    skill_aware_reflection: bool | None = None,
    skill_aware_appendix_source: str | None = None,
    config: ReflactConfig | None = None,
    overrides: Sequence[str] = (),
    support_counts: bool = False,
) -> list[dict]:
    """The saved patches, failures by index then successes (a minibatch that failed has none); reflact's
    record beside them, launched from there (its default outputs/ are in it, not in the trainer's cwd)."""
    out = _patches_dir(patches_dir)
    run_dir, cfg = out.with_name(out.name + ".reflact"), _config(config, overrides)
    r = cfg.reflect
    r.workers, r.failure_only, r.minibatch_size, r.edit_budget = workers, failure_only, minibatch_size, edit_budget
    r.seed = r.seed if random_seed is None else random_seed  # None: reflact still shuffles, with its own seed
    r.update_mode, r.meta_skill = update_mode or "patch", meta_skill_context or ""
    r.step_buffer = step_buffer(step_buffer_context, rejection_context, trajectory_memory_context)
    _skill_aware(r.skill_aware, skill_aware_reflection, skill_aware_appendix_source, read_skillopt=config is None)
    cfg.prompts.error, cfg.prompts.success = error_system, success_system
    done = _reflect(results, skill_content, prediction_dir, cfg, run_dir)
    _count_calls(done)
    aware = cfg.reflect.skill_aware
    return _leave(done.patches, out, Shape(aware.enabled, AppendixSource(aware.appendix_source).value, support_counts))


def _reflect(results: list[dict], skill: str, predictions: str, cfg: ReflactConfig, run_dir: Path):
    """reflact.reflect, launched from the run dir beside the patches."""
    from reflact.api import reflect

    return reflect(
        results=results, skill=skill, predictions=predictions, config=cfg, run_dir=run_dir, launch_dir=run_dir
    )


def _patches_dir(patches_dir: object) -> Path:
    """Where the patches go: a folder's path (made if missing), known to be usable before any call."""
    if not isinstance(patches_dir, (str, os.PathLike)) or not str(os.fspath(patches_dir)).strip():
        raise UserError(f"patches_dir must be a folder's path, got {patches_dir!r}")
    from reflact.api import usable_folder

    out = Path(patches_dir).resolve()
    usable_folder(out.with_name(out.name + ".reflact"), "patches_dir")
    return usable_folder(out, "patches_dir")


def _leave(saved: dict[str, dict], patches_dir: Path, shape: Shape) -> list[dict]:
    """The patches as SkillOpt's reflect returns them, written where SkillOpt's trainer reads them
    byte for byte as its reflect writes them (reflact's own copies, with its bookkeeping, stay in
    the run dir)."""
    patches = [as_skillopt(patch, shape) for patch in saved.values()]
    for tag, patch in zip(saved, patches, strict=True):
        write_text(patches_dir / f"{tag}.json", as_text(patch))
    return patches


def install(config: ReflactConfig | None = None, overrides: Sequence[str] = (), support_counts: bool = False) -> None:
    """Make SkillOpt's adapters reflect with reflact: sets `skillopt.gradient.reflect.run_minibatch_reflect`
    (the name EnvAdapter.reflect imports at each call) and the package's re-export to reflact's.
    `config` / `overrides` then apply to every call (e.g. `mlflow.tracking_uri=...`, `optimizer.cache=off`);
    `support_counts=True` gives each patch its `batch_size` (SkillOpt's trainer then weighs each item by
    the trajectories behind it, and its files differ from its own reflect's)."""
    with one_at_a_time():
        import skillopt.gradient
        import skillopt.gradient.reflect as module

    if not getattr(module.run_minibatch_reflect, REPLACED, False):
        setattr(module, REPLACED, module.run_minibatch_reflect)

    @functools.wraps(run_minibatch_reflect)
    def installed_reflect(*args, **kwargs):
        given = {"config": config, "overrides": overrides, "support_counts": support_counts}
        return run_minibatch_reflect(*args, **{**given, **kwargs})

    setattr(installed_reflect, REPLACED, True)
    module.run_minibatch_reflect = skillopt.gradient.run_minibatch_reflect = installed_reflect


def uninstall() -> None:
    """Put SkillOpt's own reflect back (nothing to do when reflact is not installed)."""
    with one_at_a_time():
        import skillopt.gradient
        import skillopt.gradient.reflect as module

    if getattr(module.run_minibatch_reflect, REPLACED, False):
        module.run_minibatch_reflect = skillopt.gradient.run_minibatch_reflect = getattr(module, REPLACED)


@contextlib.contextmanager
def installed(config: ReflactConfig | None = None, overrides: Sequence[str] = (), support_counts: bool = False):
    """reflact as SkillOpt's reflect stage inside the block, SkillOpt's own again after it."""
    install(config, overrides, support_counts)
    try:
        yield
    finally:
        uninstall()


def _config(config: ReflactConfig | None, overrides: Sequence[str]) -> ReflactConfig:
    """reflact's config when given; else SkillOpt's settings (OPENAI_BASE_URL still names the server)."""
    from reflact.api import compose, with_overrides

    if config is not None:
        return with_overrides(config, overrides)
    endpoint = skillopt_settings.endpoint_overrides()
    cfg = compose(endpoint.groups)
    endpoint.apply(cfg)
    return with_overrides(cfg, overrides)


def _skill_aware(
    aware: SkillAwareConfig, enabled: bool | None, appendix_source: str | None, read_skillopt: bool
) -> None:
    """What the caller passed; None reads SkillOpt's process-wide switch, as its reflect does
    (with a reflact config given: that config's setting)."""
    published = skillopt_settings.skill_aware() if read_skillopt else None
    if enabled is None and published is not None:
        enabled = published[0]
    if appendix_source is None and published is not None:
        appendix_source = published[1]
    if enabled is not None:
        aware.enabled = enabled
    if appendix_source is not None:
        aware.appendix_source = _appendix_source(appendix_source)


def _appendix_source(value: object) -> AppendixSource:
    """SkillOpt's appendix source (a string) as reflact's setting; the prompts compare the enum."""
    try:
        return AppendixSource(str(value))
    except ValueError:
        known = ", ".join(source.value for source in AppendixSource)
        raise UserError(f"skill_aware_appendix_source: {value!r} is not one of {known}") from None


def _count_calls(done) -> None:
    """Each analyst call this run made (not a cache hit, not a reused patch) into SkillOpt's token
    tracker, with the tokens the server reported: the trainer's totals then hold them."""
    from reflact.running.rundir import RunDir

    tracker = skillopt_settings.token_tracker()
    if tracker is None:
        return
    rd = RunDir(done.run_dir)
    for mb in done.summary["minibatches"]:
        if mb["status"] not in ("done", "failed"):
            continue
        for call in (rd.outcome_record(mb["tag"]) or {}).get("call_log", []):
            if "usage" in call and not call.get("from_cache"):
                tracker.record("analyst", call["usage"]["prompt"], call["usage"]["completion"])


def step_buffer(step_buffer_context: str, rejection_context: str, trajectory_memory_context: str) -> str:
    """The step-buffer context from its name and its two deprecated aliases, combined as the reference
    combines them for the failure analyst (the alias `trajectory_memory_context` is appended)."""
    for name, value in (
        ("rejection_context", rejection_context),
        ("trajectory_memory_context", trajectory_memory_context),
    ):
        if value:
            warnings.warn(f"{name} is deprecated: pass step_buffer_context", DeprecationWarning, stacklevel=3)
    context = step_buffer_context or rejection_context or ""
    if trajectory_memory_context:
        context = f"{context}\n{trajectory_memory_context}" if context else trajectory_memory_context
    return context
