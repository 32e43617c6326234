"""The checks Hydra can't express: ranges, choices and what settings need of each other, each
naming the key at fault, before any input is read or any call made."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

from reflact.config.credentials import (
    _check_key_env,
    _check_optimizer_urls,
    _check_url,
    _refuse_credentials,
    _shown,
)
from reflact.config.prices import how_to_price, read_price
from reflact.config.schema import (
    CacheMode,
    DataConfig,
    DataSource,
    Execution,
    Matcher,
    MlflowConfig,
    OptimizerConfig,
    PromptsConfig,
    Provider,
    ReflactConfig,
    ReflectConfig,
    TracesConfig,
)
from reflact.core.errors import UserError
from reflact.core.metrics import APPLY_METRICS, PROVENANCE_METRICS, RUN_METRICS
from reflact.core.modes import get_mode, normalize_mode


def validate(cfg: ReflactConfig) -> ReflactConfig:
    """Range and choice checks; returns the config with the update mode's canonical name.

    Every setting is checked here, before any input is read or any call made: numbers for
    NaN, infinity and range, URLs for scheme, host and credentials (the config is logged in
    full, so a key must never sit in it). The files that prompt and context settings name are
    read by prompts.text_or_file when the stage is built, also before any call.
    """
    cfg.reflect.update_mode = normalize_mode(cfg.reflect.update_mode)
    _check_data(cfg.data, cfg.mlflow)
    _check_reflect(cfg.reflect)
    _check_prompts(cfg.prompts)
    _check_optimizer_numbers(cfg.optimizer, get_mode(cfg.reflect.update_mode).full_rewrite)
    _check_optimizer_names(cfg.optimizer)
    _check_execution(cfg.optimizer)
    _check_optimizer_urls(cfg.optimizer)
    _check_mlflow(cfg.mlflow)
    _check_registering(cfg)
    check_analysis(cfg)
    _check_optimized_metric(cfg.optimized_metric, cfg.reflect)
    cfg.optimizer.prices = {model: read_price(model, value) for model, value in cfg.optimizer.prices.items()}
    o = cfg.optimizer
    if o.max_cost_usd is not None and o.model not in o.prices:
        raise UserError(
            f"optimizer.max_cost_usd: the model {o.model!r} has no price, so the cap could not hold; "
            f"{how_to_price(o.model)} (USD per million tokens)"
        )
    if cfg.optimized_metric in ("cost_usd", "spent_usd") and o.model not in o.prices:
        raise UserError(
            f"optimized_metric: {cfg.optimized_metric} is unknown for the model {o.model!r}, which has no "
            f"price; {how_to_price(o.model)} (USD per million tokens)"
        )
    return cfg


def check_analysis(cfg: ReflactConfig) -> None:
    a, o = cfg.analysis, cfg.optimizer
    check_threshold(a.match_threshold, "analysis.match_threshold")
    _at_least(a.max_items, 0, "analysis.max_items")
    check_threshold(a.embedding.threshold, "analysis.embedding.threshold")
    check_threshold(a.judge.candidate_threshold, "analysis.judge.candidate_threshold")
    _at_least(a.embedding.batch, 1, "analysis.embedding.batch")
    _at_least(a.judge.batch, 1, "analysis.judge.batch")
    _at_least(a.judge.max_output_tokens, 1, "analysis.judge.max_output_tokens")
    known = ("numbers", "negation", "target", "order", "operation", "wording")  # reflact.analysis.guards.NAMES
    unknown = [name for name in a.guards if name not in known]
    if unknown:
        raise UserError(f"analysis.guards: unknown guard {unknown[0]!r} (known: {', '.join(known)})")
    if not a.embedding.model or not a.embedding.model.strip():
        raise UserError("analysis.embedding.model is empty: name the embedding model the endpoint serves")
    if a.embedding.api_key_env is not None:
        _check_key_env(a.embedding.api_key_env, "analysis.embedding.api_key_env")
    if a.embedding.base_url is not None:
        _check_url(
            a.embedding.base_url,
            "analysis.embedding.base_url",
            "http://127.0.0.1:8000/v1",
            "put the key in the environment variable named by analysis.embedding.api_key_env",
        )
    if a.matcher is not Matcher.lexical and o.max_cost_usd is not None and a.embedding.model not in o.prices:
        raise UserError(
            f"analysis.embedding.model: {a.embedding.model!r} has no price, so optimizer.max_cost_usd "
            f"could not hold for the analysis; set +optimizer.prices.{a.embedding.model}={{input:...}} "
            "(USD per million tokens; 0 for a local model)"
        )


def _check_optimized_metric(name: str | None, reflect: ReflectConfig) -> None:
    if name is None:
        return
    if name not in RUN_METRICS:
        raise UserError(f"optimized_metric: unknown run metric {name!r} (known: {', '.join(RUN_METRICS)})")
    if name in APPLY_METRICS and reflect.update_mode != "patch":
        raise UserError(f"optimized_metric: {name} is counted in patch mode only, not in {reflect.update_mode}")
    if name in PROVENANCE_METRICS and not reflect.provenance:
        raise UserError(f"optimized_metric: {name} is counted with reflect.provenance=true only")


def check_threshold(value: Any, key: str) -> float:
    """A similarity threshold: a number in (0, 1]."""
    _number(value, key, high=1, above=0)
    return float(value)


def _check_data(d: DataConfig, m: MlflowConfig) -> None:
    _number(d.max_file_mb, "data.max_file_mb", above=0)
    if d.source is DataSource.mlflow:
        check_traces(d.mlflow, m)
        return
    if not d.dir and not (d.skill and d.results):
        raise UserError("no dataset: set data.dir (or data.skill and data.results)")


def check_traces(t: TracesConfig, m: MlflowConfig) -> None:
    """data.mlflow: where the traces are and what says pass or fail; the store is asked later."""
    named = t.experiment if isinstance(t.experiment, list) else [t.experiment]
    if not named or any(not isinstance(e, (str, int)) or not str(e).strip() for e in named):
        raise UserError(
            "data.mlflow.experiment: name the experiment(s) holding the traces, e.g. data.mlflow.experiment=agent"
        )
    if not t.label or not t.label.strip():
        raise UserError(
            "data.mlflow.label: name the feedback that says pass or fail, e.g. data.mlflow.label=correctness"
        )
    _number(t.pass_threshold, "data.mlflow.pass_threshold")
    if t.max_traces is not None:
        _at_least(t.max_traces, 1, "data.mlflow.max_traces")
    if t.tracking_uri is not None:
        _check_mlflow(replace(m, tracking_uri=t.tracking_uri), "data.mlflow.tracking_uri")


def _check_reflect(r: ReflectConfig) -> None:
    _at_least(r.minibatch_size, 1, "reflect.minibatch_size")
    _at_least(r.workers, 1, "reflect.workers")
    _at_least(r.max_reasks, 0, "reflect.max_reasks")
    _number(r.edit_budget, "reflect.edit_budget")  # any integer: < 0 means no limit
    _number(r.seed, "reflect.seed")
    # a NaN threshold makes every `hard < threshold` false: all runs would silently be successes
    _number(r.success_threshold, "reflect.success_threshold")


def _check_prompts(p: PromptsConfig) -> None:
    """Files are read (and missing ones reported) by prompts.text_or_file when the stage is
    built, still before any call; here only what is wrong whatever the files hold."""
    for key, value in (("prompts.error", p.error), ("prompts.success", p.success)):
        if value is not None and not value.strip():
            raise UserError(f"{key} is empty: leave it unset (null) to use the built-in template")


def _check_optimizer_numbers(o: OptimizerConfig, full_rewrite: bool) -> None:
    _number(o.timeout_s, "optimizer.timeout_s", above=0)
    _at_least(o.max_output_tokens, 1, "optimizer.max_output_tokens")
    _at_least(o.max_output_tokens_full_rewrite, 1, "optimizer.max_output_tokens_full_rewrite")
    _at_least(
        o.max_output_tokens_ceiling,
        max(o.max_output_tokens, o.max_output_tokens_full_rewrite),
        "optimizer.max_output_tokens_ceiling",
    )
    if o.temperature is not None:
        _number(o.temperature, "optimizer.temperature", low=0, high=2)
    _at_least(o.sample, 0, "optimizer.sample")
    _at_least(o.samples, 1, "optimizer.samples")
    if o.context_window is not None:
        _at_least(o.context_window, 1, "optimizer.context_window")
        allowance, allowance_key = (
            (o.max_output_tokens_full_rewrite, "optimizer.max_output_tokens_full_rewrite")
            if full_rewrite
            else (o.max_output_tokens, "optimizer.max_output_tokens")
        )
        if o.context_window <= allowance:
            raise UserError(
                f"optimizer.context_window ({o.context_window}) must be larger than {allowance_key} "
                f"({allowance}): the prompt needs room beside the reply; lower {allowance_key}"
            )
    if o.max_cost_usd is not None:
        _number(o.max_cost_usd, "optimizer.max_cost_usd", low=0)
    for key in ("rpm", "tpm"):
        if getattr(o, key) is not None:
            _at_least(getattr(o, key), 1, f"optimizer.{key}")
    _at_least(o.retry.max_attempts, 1, "optimizer.retry.max_attempts")
    for key in ("max_seconds", "initial_wait_s", "max_wait_s"):
        _number(getattr(o.retry, key), f"optimizer.retry.{key}", low=0)


def _check_execution(o: OptimizerConfig) -> None:
    """Flex and batch settings: numbers in range, and batch execution only where its results can
    reach the run (they come back through the response cache)."""
    _number(o.flex_timeout_s, "optimizer.flex_timeout_s", above=0)
    if o.flex_fallback_after is not None:
        _at_least(o.flex_fallback_after, 1, "optimizer.flex_fallback_after")
    _number(o.batch_max_wait_h, "optimizer.batch_max_wait_h", above=0)
    _at_least(o.batch_max_requests, 1, "optimizer.batch_max_requests")
    _number(o.batch_max_mb, "optimizer.batch_max_mb", above=0)
    if o.execution is not Execution.batch:
        return
    if o.dry_run:
        raise UserError("optimizer.execution=batch with a dry run: a dry run sends nothing; drop one of the two")
    if o.cache is not CacheMode.read_write:
        raise UserError(
            f"optimizer.execution=batch needs optimizer.cache=read_write, not {o.cache.value}: a batch's "
            "results reach the run through the response cache"
        )


def _check_optimizer_names(o: OptimizerConfig) -> None:
    if not o.model or not o.model.strip():
        raise UserError(
            "optimizer.model is not set: name the model the server serves, e.g. "
            "optimizer.model=qwen3:32b (the compatible, ollama and vllm presets have no default)"
        )
    if o.token_limit_param not in ("max_completion_tokens", "max_tokens"):
        raise UserError(
            f"optimizer.token_limit_param must be max_completion_tokens or max_tokens, got {o.token_limit_param!r}"
        )
    if o.reasoning_effort and not re.fullmatch(r"[A-Za-z_-]+", o.reasoning_effort):
        raise UserError(
            f"optimizer.reasoning_effort must be one word such as low, medium or high, "
            f"got {_shown(o.reasoning_effort)!r}"
        )
    _check_key_env(o.api_key_env)
    if o.cache_path is not None and not o.cache_path.strip():
        raise UserError("optimizer.cache_path is empty: leave it unset (null) for outputs/cache.db")
    if o.provider is Provider.azure:
        if not o.dry_run and not (o.azure.endpoint and o.azure.deployment):
            raise UserError("optimizer.azure.endpoint and optimizer.azure.deployment must be set for provider azure")
        if not o.azure.api_version or not o.azure.api_version.strip():
            raise UserError("optimizer.azure.api_version is empty: set the Azure OpenAI API version, e.g. 2024-10-21")


def _check_mlflow(m: MlflowConfig, uri_key: str = "mlflow.tracking_uri") -> None:
    if not 0 < m.deadline_s < math.inf:
        raise UserError(f"mlflow.deadline_s must be a positive number of seconds, not {m.deadline_s}")
    if not m.experiment or not m.experiment.strip():
        raise UserError("mlflow.experiment is empty: name the MLflow experiment, e.g. reflact")
    if m.tracking_uri:
        # a tracking server's credentials belong in MLflow's own variables, not in the logged config
        hint = (
            "use MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD or MLFLOW_TRACKING_TOKEN "
            "(for a database, its own password variable or file, e.g. PGPASSWORD)"
        )
        try:  # no stricter: MLflow takes paths with spaces, databricks://profile:prefix...
            parts = urlsplit(m.tracking_uri)
        except ValueError:
            raise UserError(f"{uri_key} is not a valid URI (check its brackets)") from None
        _refuse_credentials(parts, uri_key, hint, path_too=False)


# what MLflow takes as a prompt's name and an alias: letters, digits, - _ . (an alias no dots)
_PROMPT_NAME = re.compile(r"[A-Za-z0-9_.-]+")


_ALIAS = re.compile(r"[A-Za-z0-9_-]+")


def _check_registering(cfg: ReflactConfig) -> None:
    """The Prompt Registry settings: a name to register under, an alias MLflow takes."""
    m = cfg.mlflow
    if m.parent_run_id is not None and not re.fullmatch(r"[A-Za-z0-9_-]+", m.parent_run_id):
        raise UserError(f"mlflow.parent_run_id must be an MLflow run id, got {_shown(m.parent_run_id)!r}")
    if m.skill_name is not None and not _PROMPT_NAME.fullmatch(m.skill_name):
        raise UserError(f"mlflow.skill_name must be a prompt name (letters, digits, -_.), got {_shown(m.skill_name)!r}")
    if not _ALIAS.fullmatch(m.skill_alias or "") or m.skill_alias == "latest":
        raise UserError(
            f"mlflow.skill_alias must be an alias (letters, digits, - _; not latest), got {_shown(m.skill_alias)!r}"
        )
    from_registry = (cfg.data.skill or "").startswith("prompts:/")
    if m.register_skill and not from_registry and not m.skill_name:
        raise UserError(
            "mlflow.register_skill=true: the skill comes from a file; name its prompt with mlflow.skill_name=..."
        )
    if m.register_skill and not m.enabled:
        raise UserError("mlflow.register_skill=true needs mlflow.enabled=true (the version is linked to the run)")


def _at_least(value: int, low: int, key: str) -> None:
    _number(value, key, low=low)


def _number(
    value: object, key: str, low: float | None = None, high: float | None = None, above: float | None = None
) -> None:
    """A finite number within [low, high] (and > above); NaN and infinity pass no comparison
    the way a range check expects, so they are refused first."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"{key} must be a finite number, got {value!r}")
    if above is not None and not value > above:
        raise UserError(f"{key} must be > {above}, got {value}")
    if low is not None and value < low:
        raise UserError(f"{key} must be >= {low}, got {value}")
    if high is not None and value > high:
        raise UserError(f"{key} must be <= {high}, got {value}")
