"""SkillOpt's reflect stage, run by reflact: a trainer switches with one import,

    from reflact.compat.skillopt import run_minibatch_reflect   # was: from skillopt.gradient.reflect import ...

It takes the reference implementation's arguments (skillopt 0.2.0) and returns its return shape,
a list of raw patch dicts, and writes them as `minibatch_fail_NNN.json` / `minibatch_succ_NNN.json`
into `patches_dir`, where SkillOpt's trainer looks for them. Each patch also carries what SkillOpt's
merge and trainer read: `batch_size` (the trajectories analysed: the patch's support),
`source_type`, and failure patterns with `failure_type`, `count` and `description`.

The optimizer's endpoint and key come from the OpenAI SDK's variables, OPENAI_BASE_URL and
OPENAI_API_KEY (the model from SkillOpt's OPTIMIZER_DEPLOYMENT when set), unless a `config` is
passed. reflact's own record of the run (prompts, replies, outcomes, summary; MLflow) goes to
`<patches_dir>.reflact/`, which is also what a rerun resumes from. Where reflact deliberately
differs from the reference (sorted input, stricter parsing and re-asks, fenced trajectories,
deterministic order): see the README, "SkillOpt".
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Sequence

from reflact.config import ReflactConfig
from reflact.files import write_json


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
) -> list[dict]:
    """The saved patches, failures by index then successes (a minibatch that failed has none)."""
    from reflact.api import compose, reflect, with_overrides

    cfg = with_overrides(compose(_endpoint_overrides()) if config is None else config, overrides)
    r = cfg.reflect
    r.workers, r.failure_only, r.minibatch_size, r.edit_budget = workers, failure_only, minibatch_size, edit_budget
    r.seed = r.seed if random_seed is None else random_seed  # None: reflact still shuffles, with its own seed
    r.update_mode, r.meta_skill = update_mode or "patch", meta_skill_context or ""
    r.step_buffer = step_buffer(step_buffer_context, rejection_context, trajectory_memory_context)
    _skill_aware(cfg, skill_aware_reflection, skill_aware_appendix_source)
    cfg.prompts.error, cfg.prompts.success = error_system, success_system
    out = Path(patches_dir)
    done = reflect(results=results, skill=skill_content, predictions=prediction_dir, config=cfg,
                   run_dir=out.with_name(out.name + ".reflact"))
    for tag, patch in done.patches.items():  # where SkillOpt's trainer reads them
        write_json(out / f"{tag}.json", patch)
    return list(done.patches.values())


def _skill_aware(cfg: ReflactConfig, enabled: bool | None, appendix_source: str | None) -> None:
    """None leaves reflact's own setting (the reference reads a process-wide switch instead)."""
    if enabled is not None:
        cfg.reflect.skill_aware.enabled = enabled
    if appendix_source is not None:
        cfg.reflect.skill_aware.appendix_source = appendix_source


def step_buffer(step_buffer_context: str, rejection_context: str, trajectory_memory_context: str) -> str:
    """The step-buffer context from its name and its two deprecated aliases, combined as the reference
    combines them for the failure analyst (the alias `trajectory_memory_context` is appended)."""
    for name, value in (("rejection_context", rejection_context),
                        ("trajectory_memory_context", trajectory_memory_context)):
        if value:
            warnings.warn(f"{name} is deprecated: pass step_buffer_context", DeprecationWarning, stacklevel=3)
    context = step_buffer_context or rejection_context or ""
    if trajectory_memory_context:
        context = f"{context}\n{trajectory_memory_context}" if context else trajectory_memory_context
    return context


def _endpoint_overrides() -> list[str]:
    """The OpenAI SDK's own variables: OPENAI_BASE_URL (any OpenAI-compatible server) and
    OPENAI_API_KEY (read by name, never stored); the model from OPTIMIZER_DEPLOYMENT when set."""
    overrides = []
    if os.environ.get("OPENAI_BASE_URL"):
        overrides.append(f"optimizer.base_url={os.environ['OPENAI_BASE_URL']}")
    if os.environ.get("OPTIMIZER_DEPLOYMENT"):
        overrides.append(f"optimizer.model={os.environ['OPTIMIZER_DEPLOYMENT']}")
    return overrides
