"""The config schema (dataclasses in Hydra's ConfigStore) and the checks Hydra can't express.

Hydra rejects unknown keys and wrong types at compose time because every group merges into
these typed nodes; `validate` adds the range and choice checks and names the key at fault.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Dict, Optional

from reflact.errors import UserError
from reflact.modes import normalize_mode


class OnBadConversation(Enum):
    error = "error"
    skip = "skip"


class AppendixSource(Enum):
    both = "both"
    failure_only = "failure_only"


class StructuredOutput(Enum):
    auto = "auto"  # send the JSON schema; a server answering 400 to it is asked without, for the rest of the run
    json_schema = "json_schema"
    json_object = "json_object"
    off = "off"


class CacheMode(Enum):
    read_write = "read_write"
    read = "read"
    write = "write"
    off = "off"


class ContextOverflow(Enum):
    split = "split"  # halve the minibatch until each part fits
    shorten = "shorten"  # shorten its longest items in the middle


class Provider(Enum):
    openai = "openai"  # OpenAI or any OpenAI-compatible server at base_url
    azure = "azure"


@dataclass
class DataConfig:
    dir: Optional[str] = None  # a dataset folder; the three paths below default into it
    skill: Optional[str] = None
    results: Optional[str] = None
    predictions: Optional[str] = None
    on_bad_conversation: OnBadConversation = OnBadConversation.error
    max_file_mb: float = 64.0  # any input file larger than this is bad input (a runaway log, a wrong path)


@dataclass
class SkillAwareConfig:
    enabled: bool = False
    appendix_source: AppendixSource = AppendixSource.both


@dataclass
class ReflectConfig:
    minibatch_size: int = 8
    edit_budget: int = 4  # L < 0: no limit; L = 0 keeps no item
    seed: int = 42
    update_mode: str = "patch"
    workers: int = 16
    failure_only: bool = False
    success_threshold: float = 1e-9
    max_reasks: int = 2  # extra calls when a reply does not parse, validate, or was cut off
    allow_failed_minibatches: bool = True  # false: exit code 1 when a minibatch finally failed
    skill_aware: SkillAwareConfig = field(default_factory=SkillAwareConfig)
    step_buffer: str = ""  # text, or a path to a .md/.txt file
    meta_skill: str = ""  # text, or a path to a .md/.txt file


@dataclass
class PromptsConfig:
    error: Optional[str] = None  # override of the failure template: text or a file path
    success: Optional[str] = None


@dataclass
class Price:
    """US dollars per million tokens."""

    input: float = 0.0
    cached_input: float = 0.0
    output: float = 0.0


@dataclass
class RetryConfig:
    max_attempts: int = 6
    max_seconds: float = 900.0
    initial_wait_s: float = 1.0
    max_wait_s: float = 60.0


@dataclass
class AzureConfig:
    endpoint: Optional[str] = None  # https://<resource>.openai.azure.com
    deployment: Optional[str] = None
    api_version: str = "2024-10-21"


@dataclass
class OptimizerConfig:
    model: str = "gpt-5"
    provider: Provider = Provider.openai
    base_url: Optional[str] = None
    api_key_env: str = "OPENAI_API_KEY"  # the name of the variable, never the key
    azure: AzureConfig = field(default_factory=AzureConfig)
    timeout_s: float = 600.0
    max_output_tokens: int = 16384
    max_output_tokens_full_rewrite: int = 64000
    max_output_tokens_ceiling: int = 128000  # a reply cut off by the limit is re-asked with twice the room, up to this
    # OpenAI's reasoning models need max_completion_tokens; some older servers only know max_tokens
    token_limit_param: str = "max_completion_tokens"
    temperature: Optional[float] = None
    reasoning_effort: Optional[str] = None
    structured_output: StructuredOutput = StructuredOutput.auto
    sample: int = 0  # part of the cache key: with temperature > 0, sample=1,2,... are fresh draws
    cache: CacheMode = CacheMode.read_write
    cache_path: Optional[str] = None  # default: <launch dir>/outputs/cache.db
    context_window: Optional[int] = None  # tokens; prompts that would not fit are split or shortened
    context_overflow: ContextOverflow = ContextOverflow.split
    max_cost_usd: Optional[float] = None  # once spent, no new call starts
    rpm: Optional[int] = None  # requests per minute, shared by all workers of a run
    tpm: Optional[int] = None  # tokens per minute (prompt estimate + output allowance)
    dry_run: bool = False  # build and save every prompt, estimate tokens and cost, call nothing
    retry: RetryConfig = field(default_factory=RetryConfig)
    # model -> {input, cached_input, output}; plain dicts so a new model can be priced on the
    # command line (+optimizer.prices.my-model={input:1,output:2}); checked by validate()
    prices: Dict[str, Any] = field(default_factory=dict)


@dataclass
class MlflowConfig:
    enabled: bool = True
    trace_calls: bool = False  # one MLflow trace per optimizer call, linked to the run
    tracking_uri: Optional[str] = None  # default: sqlite:///<launch dir>/outputs/mlflow.db
    experiment: str = "reflact"


@dataclass
class ReflactConfig:
    name: str = "default"  # names the sweep folder outputs/sweeps/<name>, so rerunning a sweep resumes it
    data: DataConfig = field(default_factory=DataConfig)
    reflect: ReflectConfig = field(default_factory=ReflectConfig)
    prompts: PromptsConfig = field(default_factory=PromptsConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)


PROJECT_DIR = Path(__file__).resolve().parent.parent


def register() -> None:
    """Make the schema available to conf/config.yaml's defaults list, and `${project_dir:}`
    to configs that name files shipped with the project (the demo dataset)."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    ConfigStore.instance().store(name="reflact_schema", node=ReflactConfig)
    if not OmegaConf.has_resolver("project_dir"):
        OmegaConf.register_new_resolver("project_dir", lambda: str(PROJECT_DIR))


def from_hydra(dict_cfg) -> tuple[ReflactConfig, dict[str, str]]:
    """The typed, checked config and its params (flat strings, as tracked) from a config Hydra
    composed or a run's saved `.hydra/config.yaml`: the one way a config becomes settings."""
    from omegaconf import OmegaConf

    # merging into the schema also rejects keys added with `+`, which Hydra lets through
    typed = OmegaConf.merge(OmegaConf.structured(ReflactConfig), OmegaConf.to_container(dict_cfg))
    cfg = validate(OmegaConf.to_object(typed))
    return cfg, params(cfg)


def params(cfg: ReflactConfig) -> dict[str, str]:
    """The whole config flattened to `section.key` strings (no secrets: keys are never in it)."""
    from omegaconf import OmegaConf

    return _flatten(OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True, enum_to_str=True))


PARAM_MAX_CHARS = 500  # long texts (step buffer, meta skill) go in as artifacts, not params


def _flatten(tree: object, prefix: str = "") -> dict[str, str]:
    if isinstance(tree, dict):
        out: dict[str, str] = {}
        for key, value in tree.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    text = "" if tree is None else str(tree)
    if len(text) > PARAM_MAX_CHARS:
        text = text[: PARAM_MAX_CHARS - 1] + "…"
    return {prefix.rstrip("."): text}


def validate(cfg: ReflactConfig) -> ReflactConfig:
    """Range and choice checks; returns the config with the update mode's canonical name."""
    r = cfg.reflect
    _at_least(r.minibatch_size, 1, "reflect.minibatch_size")
    _at_least(r.workers, 1, "reflect.workers")
    _at_least(r.max_reasks, 0, "reflect.max_reasks")
    o = cfg.optimizer
    _at_least(o.max_output_tokens, 1, "optimizer.max_output_tokens")
    _at_least(o.max_output_tokens_full_rewrite, 1, "optimizer.max_output_tokens_full_rewrite")
    _at_least(o.retry.max_attempts, 1, "optimizer.retry.max_attempts")
    _at_least(o.max_output_tokens_ceiling, max(o.max_output_tokens, o.max_output_tokens_full_rewrite),
              "optimizer.max_output_tokens_ceiling")
    for key in ("rpm", "tpm"):
        if getattr(o, key) is not None:
            _at_least(getattr(o, key), 1, f"optimizer.{key}")
    if o.max_cost_usd is not None and o.max_cost_usd < 0:
        raise UserError(f"optimizer.max_cost_usd must be >= 0, got {o.max_cost_usd}")
    if o.provider is Provider.azure and not o.dry_run and not (o.azure.endpoint and o.azure.deployment):
        raise UserError("optimizer.azure.endpoint and optimizer.azure.deployment must be set for provider azure")
    if o.timeout_s <= 0:
        raise UserError(f"optimizer.timeout_s must be > 0, got {o.timeout_s}")
    if o.token_limit_param not in ("max_completion_tokens", "max_tokens"):
        raise UserError(
            "optimizer.token_limit_param must be max_completion_tokens or max_tokens, "
            f"got {o.token_limit_param!r}"
        )
    if not o.model:
        raise UserError("optimizer.model is empty: set the optimizer model's name")
    o.prices = {model: _price(model, value) for model, value in o.prices.items()}
    r.update_mode = normalize_mode(r.update_mode)
    d = cfg.data
    if not d.dir and not (d.skill and d.results):
        raise UserError("no dataset: set data.dir (or data.skill and data.results)")
    return cfg


def dataset_paths(data: DataConfig) -> tuple[Path, Path, Path]:
    """(skill, results, predictions), explicit paths winning over those inside data.dir."""
    base = Path(data.dir) if data.dir else None
    skill = Path(data.skill) if data.skill else base / "skill.md"
    if data.results:
        results = Path(data.results)
    else:
        jsonl = base / "results.jsonl"
        results = jsonl if jsonl.exists() or not (base / "results.json").exists() else base / "results.json"
    if data.predictions:
        predictions = Path(data.predictions)
    else:
        predictions = (base or results.parent) / "predictions"
    return skill, results, predictions


def _price(model: str, value: object) -> Price:
    if isinstance(value, Price):
        return value
    try:
        price = Price(**dict(value))
        for amount in (price.input, price.cached_input, price.output):
            if float(amount) < 0:
                raise ValueError("negative")
        return Price(float(price.input), float(price.cached_input), float(price.output))
    except (TypeError, ValueError):
        raise UserError(
            f"optimizer.prices.{model}: expected {{input, cached_input, output}} as non-negative numbers, got {value!r}"
        ) from None


def _at_least(value: int, low: int, key: str) -> None:
    if value < low:
        raise UserError(f"{key} must be >= {low}, got {value}")
