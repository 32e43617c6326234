"""What each part of a run gets, and what each key does to results."""

from __future__ import annotations

from dataclasses import dataclass

from reflact.config.schema import (
    AnalysisConfig,
    DataConfig,
    MlflowConfig,
    OptimizerConfig,
    PromptsConfig,
    ReflactConfig,
    ReflectConfig,
)
from reflact.config.unchanging import UNCHANGING

# What each part of a run gets.
# The whole ReflactConfig reaches only the entry points and this module, which records it (params,
# the saved config) and decides, for every key, whether it changes results: UNCHANGING above (a
# rerun resumes), SHAPING below (in every saved patch's fingerprint), or neither (it changes the
# messages, which the fingerprint holds whole). The parts get their sections, or a small
# dataclass made from them (tests/test_config_parts.py keeps it so).


@dataclass(frozen=True)
class Parts:
    """The checked config's sections, built once at the entry: what the run's orchestration
    (reflact.orchestration.experiment) hands its parts, each the section(s) it uses."""

    data: DataConfig
    reflect: ReflectConfig
    prompts: PromptsConfig
    optimizer: OptimizerConfig
    mlflow: MlflowConfig
    analysis: AnalysisConfig


def parts(cfg: ReflactConfig) -> Parts:
    return Parts(cfg.data, cfg.reflect, cfg.prompts, cfg.optimizer, cfg.mlflow, cfg.analysis)


# the keys a saved patch's fingerprint holds besides its messages, as Shape names them
SHAPING = {
    "optimizer.model": "model",
    "reflect.update_mode": "mode",
    "reflect.edit_budget": "budget",
    "optimizer.temperature": "temperature",
    "optimizer.reasoning_effort": "reasoning_effort",
    "optimizer.sample": "sample",
    "optimizer.samples": "samples",
}


@dataclass(frozen=True)
class Shape:
    """What of the settings shapes a call without showing in its messages (running.rundir.fingerprint)."""

    model: str
    mode: str
    budget: int
    temperature: float | None
    reasoning_effort: str | None
    sample: int
    samples: int


def shape(reflect: ReflectConfig, optimizer: OptimizerConfig) -> Shape:
    sections = {"reflect": reflect, "optimizer": optimizer}
    return Shape(**{name: getattr(sections[key.split(".")[0]], key.split(".")[1]) for key, name in SHAPING.items()})


# The other keys that do not reach the fingerprint themselves, each with everything under it.
# Through the messages, which each fingerprint holds whole: the dataset, which runs a minibatch
# shows and in what order, the templates and contexts, how a prompt is split to fit the window.
THROUGH_MESSAGES = (
    "data",
    "reflect.minibatch_size",
    "reflect.seed",
    "reflect.failure_only",
    "reflect.success_threshold",
    "reflect.skill_aware",
    "reflect.step_buffer",
    "reflect.meta_skill",
    "reflect.provenance",
    "prompts",
    "optimizer.context_window",
    "optimizer.context_overflow",
)
# How a call is sent, re-asked and judged, not what it asks: a rerun keeps the patches it saved,
# and only its new calls follow the changed setting.
REUSED = (
    "reflect.max_reasks",
    "reflect.allow_failed_minibatches",
    "optimizer.provider",
    "optimizer.azure.deployment",
    "optimizer.azure.api_version",
    "optimizer.max_output_tokens",
    "optimizer.max_output_tokens_full_rewrite",
    "optimizer.max_output_tokens_ceiling",
    "optimizer.token_limit_param",
    "optimizer.structured_output",
    "optimizer.dry_run",
)


def decided(key: str) -> list[str]:
    """Which of UNCHANGING, SHAPING, THROUGH_MESSAGES and REUSED a key (`section.key`) is under:
    exactly one for every key of the schema (tests/test_config_parts.py)."""
    under = {
        "UNCHANGING": UNCHANGING,
        "SHAPING": tuple(SHAPING),
        "THROUGH_MESSAGES": THROUGH_MESSAGES,
        "REUSED": REUSED,
    }
    return [name for name, keys in under.items() if any(key == k or key.startswith(k + ".") for k in keys)]
