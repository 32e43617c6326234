"""The config schema (dataclasses in Hydra's ConfigStore) and the checks Hydra can't express.

Hydra rejects unknown keys and wrong types at compose time because every group merges into
these typed nodes; `validate` adds the range and choice checks and names the key at fault.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, is_dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any, cast
from urllib.parse import SplitResult, parse_qsl, urlsplit

from reflact.errors import UserError
from reflact.imports import one_at_a_time
from reflact.metrics import APPLY_METRICS, PROVENANCE_METRICS, RUN_METRICS
from reflact.modes import get_mode, normalize_mode

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# `${` with the backslashes before it: what OmegaConf would read as an interpolation
_INTERPOLATION = re.compile(r"(\\*)\$\{")
# well-known prefixes of provider keys and tokens: such a value is a secret, never a name or a URL part
_KEY_PREFIXES = ("sk-", "sk_", "sess-", "gsk_", "xai-", "pplx-", "hf_", "AIza", "ghp_", "github_pat_", "glpat-")
_SECRET_WORDS = {
    "key",
    "apikey",
    "token",
    "secret",
    "password",
    "passwd",
    "pwd",
    "auth",
    "authorization",
    "sig",
    "signature",
    "credential",
    "credentials",
    "jwt",
    "bearer",
    "session",
}


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


class ServiceTier(Enum):
    auto = "auto"  # nothing sent: the project's default tier
    flex = "flex"  # batch prices, synchronous, slower; a 429 "resource unavailable" is not billed
    default = "default"
    priority = "priority"


class Execution(Enum):
    live = "live"  # one request at a time, as the stage goes
    batch = "batch"  # every request known up front sent as a Batch API job (reflact.running.batch)


class BatchReasks(Enum):
    batch = "batch"  # re-asks go as a follow-up batch
    live = "live"  # re-asks are sent live once the first batch is in


# tiers a price may name its own amounts for; flex and batch default to half the listed price
TIERS = ("flex", "batch", "priority")
HALF_PRICE_TIERS = ("flex", "batch")


class Provider(Enum):
    openai = "openai"  # OpenAI or any OpenAI-compatible server at base_url
    azure = "azure"


class DataSource(Enum):
    files = "files"  # a dataset folder: data.dir, or data.skill and data.results
    mlflow = "mlflow"  # scored traces in MLflow: data.mlflow (reflact.inputs.traces)


@dataclass
class TracesConfig:
    """Where the traces are and which of them are read (data.source=mlflow)."""

    experiment: Any = None  # an experiment's name or id, or a list of them
    filter: str | None = None  # MLflow's search_traces filter, passed through as written
    label: str | None = None  # the feedback whose value says pass or fail
    pass_threshold: float = 0.5  # a numeric label passes at or above this
    max_traces: int | None = None  # at most this many labelled traces, the newest first (null: all)
    tracking_uri: str | None = None  # default: mlflow.tracking_uri


@dataclass
class DataConfig:
    dir: str | None = None  # a dataset folder; the three paths below default into it
    # the skill file (default: skill.md in data.dir)
    skill: str | None = None
    # the results file, one JSON object per run (default: results.jsonl in data.dir)
    results: str | None = None
    # the folder of conversations, one per run (default: predictions/ in data.dir)
    predictions: str | None = None
    # skip: leave out runs whose conversation file is corrupt, recording why; error: stop
    on_bad_conversation: OnBadConversation = OnBadConversation.error
    max_file_mb: float = 64.0  # any input file larger than this is bad input (a runaway log, a wrong path)
    # files: a dataset folder (data.dir); mlflow: scored traces in an MLflow store (data.mlflow)
    source: DataSource = DataSource.files
    mlflow: TracesConfig = field(default_factory=TracesConfig)


@dataclass
class SkillAwareConfig:
    # failures are classified SKILL_DEFECT (an edit) or EXECUTION_LAPSE (a note in appendix_notes)
    enabled: bool = False
    # failure_only: successes may not add notes
    appendix_source: AppendixSource = AppendixSource.both


@dataclass
class ReflectConfig:
    # M: trajectories per call (at least 1)
    minibatch_size: int = 8
    # L: items kept per minibatch (a full rewrite is not cut)
    edit_budget: int = 4  # L < 0: no limit; L = 0 keeps no item
    # failures are shuffled with it, successes with seed + 1 (the order does not depend on M)
    seed: int = 42
    # patch (edits), rewrite_from_suggestions (rewrite) or full_rewrite_minibatch (full_rewrite)
    update_mode: str = "patch"
    # calls in flight at once
    workers: int = 16
    # drop the successes: failures alone are analysed
    failure_only: bool = False
    # a run whose `hard` score is below it is a failure
    success_threshold: float = 1e-9
    max_reasks: int = 2  # extra calls when a reply does not parse, validate, or was cut off
    allow_failed_minibatches: bool = True  # false: exit code 1 when a minibatch finally failed
    skill_aware: SkillAwareConfig = field(default_factory=SkillAwareConfig)
    # the previous steps of this epoch, shown under their heading in the user message
    step_buffer: str = ""  # text, or a path to a .md/.txt file
    # earlier lessons for the optimizer, to prefer when the minibatch's evidence is ambiguous
    meta_skill: str = ""  # text, or a path to a .md/.txt file
    # ask the analyst which trajectories (by position) motivate each item; recorded as ids per item
    provenance: bool = False


@dataclass
class PromptsConfig:
    error: str | None = None  # override of the failure template: text or a file path
    # override of the success template: text or a file path
    success: str | None = None


@dataclass
class Price:
    """US dollars per million tokens."""

    input: float = 0.0
    cached_input: float = 0.0
    output: float = 0.0
    tiers: dict[str, Price] = field(default_factory=dict)  # a tier's own price (flex, batch, priority)

    def at(self, tier: str) -> Price:
        """The price of a reply served at `tier` (as the reply names it): the tier's own when given,
        else half the listed amounts for flex and batch, else the listed price."""
        if tier in self.tiers:
            return self.tiers[tier]
        if tier in HALF_PRICE_TIERS:
            return Price(self.input / 2, self.cached_input / 2, self.output / 2)
        return Price(self.input, self.cached_input, self.output)

    def most(self, other: Price) -> Price:
        """The larger of two prices, amount by amount: what the cost cap counts when either may apply."""
        return Price(
            max(self.input, other.input), max(self.cached_input, other.cached_input), max(self.output, other.output)
        )


@dataclass
class RetryConfig:
    # attempts per request (HTTP 408, 409, 429, 5xx, timeouts, dropped connections, malformed bodies are retried)
    max_attempts: int = 6
    # retries stop when the next wait would pass this many seconds in all
    max_seconds: float = 900.0
    # the first backoff wait, doubled each retry, plus up to this much jitter
    initial_wait_s: float = 1.0
    # the longest one wait, a server's Retry-After included
    max_wait_s: float = 60.0


@dataclass
class AzureConfig:
    # the Azure OpenAI resource's endpoint, for optimizer=azure
    endpoint: str | None = None  # https://<resource>.openai.azure.com
    # the Azure deployment that serves the model
    deployment: str | None = None
    # the Azure OpenAI API version sent
    api_version: str = "2024-10-21"


@dataclass
class OptimizerConfig:
    # the optimizer model, as the server names it
    model: str = "gpt-5"
    # openai (or any OpenAI-compatible server at base_url) or azure (set by optimizer=azure)
    provider: Provider = Provider.openai
    # the server's URL (default: OpenAI's API)
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"  # the name of the variable, never the key
    azure: AzureConfig = field(default_factory=AzureConfig)
    # the longest one request may take, connect to last byte
    timeout_s: float = 600.0
    # output allowance per call
    max_output_tokens: int = 16384
    # output allowance per call in full rewrite mode (a whole skill)
    max_output_tokens_full_rewrite: int = 64000
    max_output_tokens_ceiling: int = 128000  # a reply cut off by the limit is re-asked with twice the room, up to this
    # OpenAI's reasoning models need max_completion_tokens; some older servers only know max_tokens
    token_limit_param: str = "max_completion_tokens"
    # sent only when set
    temperature: float | None = None
    # sent only when set (for reasoning models)
    reasoning_effort: str | None = None
    # how the reply's JSON shape is asked for: the mode's JSON schema, JSON object mode, or off
    structured_output: StructuredOutput = StructuredOutput.auto
    sample: int = 0  # part of the cache key: with temperature > 0, sample=1,2,... are fresh draws
    # draws per minibatch: draw d is asked with sample index `sample + d` (and, when > 1, that seed)
    samples: int = 1
    # the response cache: read and write, read or write only, or off
    cache: CacheMode = CacheMode.read_write
    # the response cache's file
    cache_path: str | None = None  # default: <launch dir>/outputs/cache.db
    context_window: int | None = None  # tokens; prompts that would not fit are split or shortened
    # what becomes of a prompt that would not fit optimizer.context_window
    context_overflow: ContextOverflow = ContextOverflow.split
    max_cost_usd: float | None = None  # spend never passes it: a call starts only if its worst case fits
    rpm: int | None = None  # requests per minute, shared by all workers of a run
    tpm: int | None = None  # tokens per minute (prompt estimate + output allowance)
    dry_run: bool = False  # build and save every prompt, estimate tokens and cost, call nothing
    retry: RetryConfig = field(default_factory=RetryConfig)
    service_tier: ServiceTier = ServiceTier.auto  # sent as `service_tier` unless auto
    flex_timeout_s: float = 900.0  # with flex, the longest one request may take (flex replies are slower)
    flex_fallback_after: int | None = None  # flex 429s "resource unavailable" for one request before it goes at auto
    # how requests are sent: live, or as Batch API jobs at half price
    execution: Execution = Execution.live
    batch_wait: bool = True  # false: submit the batch and return at once
    # with execution=batch: re-asks go as a follow-up batch, or live once the first batch is in
    batch_reasks: BatchReasks = BatchReasks.batch
    batch_max_wait_h: float = 25.0  # a batch still unfinished this long after its creation is left to a later command
    # the Batch API's requests at most
    batch_max_requests: int = 50000  # per input file (Azure allows 100,000)
    # the Batch API's file size at most, in MB
    batch_max_mb: float = 200.0  # per input file
    # model -> {input, cached_input, output}; plain dicts so a new model can be priced on the
    # command line (+optimizer.prices.my-model={input:1,output:2}); checked by validate()
    prices: dict[str, Any] = field(default_factory=dict)


@dataclass
class MlflowConfig:
    # false: nothing is logged to MLflow (the run dir holds everything either way)
    enabled: bool = True
    trace_calls: bool = True  # one MLflow trace per optimizer call, linked to the run
    # where runs are logged: an MLflow tracking URI (a server, a database)
    tracking_uri: str | None = None  # default: sqlite:///<launch dir>/outputs/mlflow.db
    # the MLflow experiment runs are logged to
    experiment: str = "reflact"
    # the longest a run waits at its end for its MLflow run to be written, counted from its last
    # reply, whatever the store does (down, frozen, slow, a backlog); then one warning, and relog
    # logs the run later (a local sqlite store busy with a sweep's other jobs, not failing, gets
    # at least 120 s)
    deadline_s: float = 10.0
    # the patched skill registered as a new version in MLflow's Prompt Registry, linked to the run:
    # of the prompt data.skill names (prompts:/name@alias), else of skill_name (a skill from a file)
    register_skill: bool = False
    # the prompt to register a skill from a file under (a registry skill keeps its own name)
    skill_name: str | None = None
    # the one alias reflact moves (to the version it registers); production, champion... never.
    # Per sweep cell: reflact-M${reflect.minibatch_size}-L${reflect.edit_budget}
    skill_alias: str = "reflact-candidate"
    # the run this one becomes a child of (a sweep: its parent run); in Python, an active
    # `mlflow.start_run()` is the parent unless this is set
    parent_run_id: str | None = None
    # a `reflact.edit` feedback on each trace of a kept edit's minibatch (task ids that are traces)
    edit_feedback: bool = True


class Matcher(Enum):
    lexical = "lexical"  # rapidfuzz on the words: offline, free, blind to paraphrases
    embedding = "embedding"  # cosine of embeddings from an OpenAI-compatible /v1/embeddings
    judge = "judge"  # embedding neighbours confirmed by the optimizer model


@dataclass
class EmbeddingConfig:
    # the OpenAI-compatible server whose /v1/embeddings the embedding and judge matchers use
    base_url: str | None = None  # default: optimizer.base_url
    # the embedding model of the embedding and judge matchers
    model: str = "text-embedding-3-small"
    # the name of the variable holding that server's key
    api_key_env: str | None = None  # default: optimizer.api_key_env
    # cosine at or above which two items match (bench/README.md: the labelled pairs' figures)
    threshold: float = 0.9
    batch: int = 64  # texts per request


@dataclass
class JudgeConfig:
    # embedding neighbours at or above this cosine are asked about (the judge only removes matches)
    candidate_threshold: float = 0.85
    batch: int = 20  # pairs per question
    # output allowance per judge question
    max_output_tokens: int = 2048


@dataclass
class AnalysisConfig:
    # which matcher decides that two items are the same change (docs/agreement.md)
    matcher: Matcher = Matcher.lexical
    # vetoes on embedding matches (reflact.analysis.guards: numbers, negation, target, order, operation,
    # wording); negation is left out by default: on the labelled pairs it cost 7 of 30 paraphrases
    # (bench/README.md); wording embeds the differing words of two mostly shared wordings
    guards: list[str] = field(default_factory=lambda: ["numbers", "target", "order", "operation", "wording"])
    embedding: EmbeddingConfig = field(default_factory=EmbeddingConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    # two items match when every compared field (lowercased, whitespace collapsed, words sorted)
    # is at least this similar (rapidfuzz's token-sort ratio / 100); see reflact.analysis.matching
    match_threshold: float = 0.85
    # every pair of kept items is compared: the work grows with their square, so a run with more
    # skips its own analysis (python -m reflact.analyze still makes it, when asked)
    max_items: int = 20000


@dataclass
class ReflactConfig:
    name: str = "default"  # names the sweep folder outputs/sweeps/<name>, so rerunning a sweep resumes it
    optimized_metric: str | None = None  # a run metric the job returns, for sweepers such as Optuna
    data: DataConfig = field(default_factory=DataConfig)
    reflect: ReflectConfig = field(default_factory=ReflectConfig)
    prompts: PromptsConfig = field(default_factory=PromptsConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    analysis: AnalysisConfig = field(default_factory=AnalysisConfig)


# Settings that cannot change a run's patches, each with everything under it: where the calls go
# and with which key, how they are paced, retried, capped and priced, the response cache, tracking,
# the analysis after the stage, the sweep's name. None of them reaches the patch fingerprint
# (rundir.fingerprint: the model, mode, L, decoding, draw and the messages, which the data, reflect
# and prompts settings build); they only decide whether a call succeeds and what is recorded of it,
# and a rerun redoes what failed. A sweep leaves them out of its fixed settings and (with Hydra's
# launch keys) of its job folder names, so changing one resumes the sweep.
UNCHANGING = (
    "name",
    "optimized_metric",
    "reflect.workers",
    "optimizer.base_url",
    "optimizer.azure.endpoint",
    "optimizer.api_key_env",
    "optimizer.timeout_s",
    "optimizer.retry",
    "optimizer.rpm",
    "optimizer.tpm",
    "optimizer.max_cost_usd",
    "optimizer.prices",
    "optimizer.cache",
    "optimizer.cache_path",
    "optimizer.service_tier",
    "optimizer.flex_timeout_s",
    "optimizer.flex_fallback_after",
    "optimizer.execution",
    "optimizer.batch_wait",
    "optimizer.batch_reasks",
    "optimizer.batch_max_wait_h",
    "optimizer.batch_max_requests",
    "optimizer.batch_max_mb",
    "mlflow",
    "analysis",
)
LAUNCH = ("hydra", "cluster")  # override keys that choose where and how jobs run, not what they do


def unchanging(key: str) -> bool:
    """Whether a setting (`section.key`, as in params) is one of UNCHANGING or under one."""
    return any(key == name or key.startswith(name + ".") for name in UNCHANGING)


def unchanging_overrides(overrides) -> list[str]:
    """The keys of the overrides that leave the results alone, for Hydra's override_dirname.exclude_keys
    (which matches whole keys: a price override names its model, +optimizer.prices.<model>=...)."""
    with one_at_a_time():
        from hydra.core.override_parser.overrides_parser import OverridesParser

    keys = [o.key_or_group for o in OverridesParser.create().parse_overrides(list(overrides))]
    return [key for key in keys if unchanging(key) or key.replace("/", ".").split(".")[0] in LAUNCH]


# config groups reflact's defaults leave out: `exp=demo` picks one as for any group, and Hydra's own
# spelling for adding a group, `+exp=demo`, works too
ADDED_GROUPS = ("exp", "cluster")


def hydra_spelling(overrides: Sequence[str]) -> list[str]:
    """The overrides with `exp=<name>` spelled `+exp=<name>` (and `cluster=`). Hydra 1.3 takes one
    spelling per group: with `exp: null` in the defaults `+exp=` fails ("Multiple values for exp"),
    without it `exp=` fails ("No match in the defaults list"). Kept out of the defaults and spelled
    `+exp=`, both work and name the job folders sweeps always had (`+exp=demo,...`)."""
    return [f"+{o}" if o.split("=", 1)[0] in ADDED_GROUPS and "=" in o else o for o in overrides]


def apply_settings(node, overrides: Sequence[str], where: str, under: tuple[str, ...] = ()) -> None:
    """`key=value` settings in the command line's grammar (Hydra's overrides: `off` is text,
    `{input:1,output:4}` a mapping, quotes and `null` as there), applied to a config node the way
    Hydra applies them: a key must exist, `+key=value` adds one, `++key=value` adds or sets one.
    Config groups, deletions (`~key`) and sweeps (`a=1,2`) are not settings; `under` limits the keys.
    A mistake names `where` (the option) and the override."""
    with one_at_a_time():
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from hydra.errors import HydraException
        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException

    for line in overrides:
        try:
            [override] = OverridesParser.create().parse_overrides([line])
        except HydraException as exc:
            raise UserError(f"{where} {line}: {' '.join(str(exc).split())[:200]}") from None
        key = override.key_or_group
        if override.is_delete() or override.is_sweep_override() or override.package is not None or "." not in key:
            raise UserError(f"{where} {line}: give one setting, KEY=VALUE (not a config group, ~ or a sweep)")
        if under and not key.startswith(under):
            raise UserError(f"{where} {line}: give a key under {' or '.join(under)}")
        value = override.value()
        if override.is_add() and OmegaConf.select(node, key, default=None) is not None and not isinstance(value, dict):
            raise UserError(f"{where} {line}: {key} is already set: drop the +, or use ++ to add or set it")
        try:
            OmegaConf.update(node, key, value, merge=True, force_add=override.is_add() or override.is_force_add())
        except OmegaConfBaseException as exc:
            raise UserError(f"{where} {line}: {str(exc.msg or exc).strip().splitlines()[0]}") from None


def register() -> None:
    """Make the schema available to conf/config.yaml's defaults list, `${shipped:demo}` to configs
    that name files shipped with reflact (the demo dataset), wherever it is installed, and
    `${unchanging:...}` to its job folder names."""
    with one_at_a_time():
        from hydra.core.config_store import ConfigStore
        from omegaconf import OmegaConf

    from reflact.shipped import shipped_dir

    ConfigStore.instance().store(name="reflact_schema", node=ReflactConfig)
    if not OmegaConf.has_resolver("shipped"):
        OmegaConf.register_new_resolver("shipped", lambda name: str(shipped_dir(name)))
    if not OmegaConf.has_resolver("unchanging"):
        OmegaConf.register_new_resolver("unchanging", unchanging_overrides)


def from_hydra(dict_cfg) -> tuple[ReflactConfig, dict[str, str]]:
    """The typed, checked config and its params (flat strings, as tracked) from a config Hydra
    composed or a run's saved `.hydra/config.yaml`: the one way a config becomes settings."""
    cfg = validate(typed(dict_cfg))
    return cfg, params(cfg)


def typed(dict_cfg) -> ReflactConfig:
    """The schema's dataclasses from a composed config, not yet checked (see validate)."""
    with one_at_a_time():
        from omegaconf import OmegaConf

    # a config Hydra composed is already typed by the schema; only keys added with `+`, which Hydra
    # lets through, need the merge into the schema (~50 ms) that rejects them by name
    if OmegaConf.get_type(dict_cfg) is ReflactConfig and not _added_keys(dict_cfg):
        return cast(ReflactConfig, OmegaConf.to_object(dict_cfg))
    merged = OmegaConf.merge(OmegaConf.structured(ReflactConfig), OmegaConf.to_container(dict_cfg))
    return cast(ReflactConfig, OmegaConf.to_object(merged))


def _added_keys(node) -> bool:
    """Whether a typed node, or one inside it, holds a key its dataclass has no field for (a dict,
    e.g. the price table, takes any key; its values may be typed nodes)."""
    with one_at_a_time():
        from omegaconf import DictConfig, OmegaConf

    kind = OmegaConf.get_type(node)
    names = {f.name for f in fields(kind)} if is_dataclass(kind) else None
    for key in node:
        if names is not None and key not in names:
            return True
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_none() and _added_keys(child):
            return True
    return False


def literal(value: Any) -> Any:
    """A typed config (or any value in it) whose texts OmegaConf reads back verbatim: each `${` is
    escaped, and so are the backslashes before it. A config object's texts are data (a meta skill an
    optimizer wrote, a folder named data_${x}): interpolating them could read any variable."""
    if isinstance(value, str):
        return _INTERPOLATION.sub(lambda m: m.group(1) * 2 + "\\${", value)
    if is_dataclass(value) and not isinstance(value, type):
        return replace(value, **{f.name: literal(getattr(value, f.name)) for f in fields(value)})
    if isinstance(value, list):
        return [literal(v) for v in value]
    if isinstance(value, dict):
        return {k: literal(v) for k, v in value.items()}
    return value


def params(cfg: ReflactConfig) -> dict[str, str]:
    """The settings as `section.key` strings: what was set, leaving out empty ones, the Azure block
    unless in use and prices of other models (no secrets: keys are never in the config)."""
    # from the dataclasses, not through OmegaConf: a text is never interpolated here
    tree = cast(dict, _plain(cfg))
    if cfg.optimizer.provider is not Provider.azure:
        del tree["optimizer"]["azure"]
    tree["optimizer"]["prices"] = {m: p for m, p in tree["optimizer"]["prices"].items() if m == cfg.optimizer.model}
    return {key: value for key, value in _flatten(tree).items() if value != ""}


def _plain(value: object) -> object:
    """The settings as plain dicts and values, enums by name (as OmegaConf would give them)."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value.name if isinstance(value, Enum) else value


PARAM_MAX_CHARS = 500  # long texts (step buffer, meta skill) go in as artifacts, not params


def _flatten(tree: object, prefix: str = "") -> dict[str, str]:
    if isinstance(tree, dict):
        out: dict[str, str] = {}
        for key, value in tree.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): param_text("" if tree is None else str(tree))}


def param_text(text: str) -> str:
    """A param's value as logged: at most PARAM_MAX_CHARS characters, a longer one cut to its first
    PARAM_MAX_CHARS - 1 and `…` (every param: a run's settings, a sweep parent's swept values)."""
    return text if len(text) <= PARAM_MAX_CHARS else text[: PARAM_MAX_CHARS - 1] + "…"


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
    _check_analysis(cfg)
    _check_optimized_metric(cfg.optimized_metric, cfg.reflect)
    cfg.optimizer.prices = {model: _price(model, value) for model, value in cfg.optimizer.prices.items()}
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


def _check_analysis(cfg: ReflactConfig) -> None:
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


def priced(cfg: ReflactConfig) -> bool:
    """Whether the model has a price: without one every cost is unknown (None), never $0."""
    return cfg.optimizer.model in cfg.optimizer.prices


def how_to_price(model: str) -> str:
    """What to set to price `model`; a name with `/`, `.` or `:` (a proxy's `openai/gpt-4o-mini`)
    cannot be a key of a command-line override, so it goes in a config file."""
    import re

    if re.fullmatch(r"[A-Za-z0-9_-]+", model):
        return f"set +optimizer.prices.{model}={{input:...,cached_input:...,output:...}}"
    return (
        f'add "{model}": {{input: ..., cached_input: ..., output: ...}} under optimizer.prices in your '
        "experiment's yaml"
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


def _check_key_env(name: str, key: str = "optimizer.api_key_env") -> None:
    """The key lives in the environment; the config (logged in full) only names the variable.
    A value that is not a variable's name may be the key itself: it is never echoed."""
    if name and _ENV_NAME.fullmatch(name) and not _looks_like_key(name):
        return
    if not name:
        raise UserError(f"{key} is empty: name the environment variable that holds the key, e.g. OPENAI_API_KEY")
    # a short value that is no key is echoed to help spot the typo; anything else may be the key
    shown = "value not shown: it may be a key" if _looks_like_key(name) or len(name) > 20 else f"got {name!r}"
    raise UserError(
        f"{key} must be the name of an environment variable (letters, digits, _; "
        f"{shown}), not the key: put the key in a variable such as OPENAI_API_KEY and set "
        f"{key} to that variable's name"
    )


def _check_optimizer_urls(o: OptimizerConfig) -> None:
    hint = f"put the key in the environment variable named by optimizer.api_key_env ({o.api_key_env})"
    if o.base_url is not None:
        _check_url(o.base_url, "optimizer.base_url", "http://127.0.0.1:8000/v1", hint)
    if o.azure.endpoint is not None:
        _check_url(o.azure.endpoint, "optimizer.azure.endpoint", "https://<resource>.openai.azure.com", hint)


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


def _check_url(value: str, key: str, example: str, hint: str) -> None:
    """An http(s) URL with a host and no credentials; the value is never echoed, it may hold a key."""
    if not value.strip():
        raise UserError(f"{key} is empty: give a URL such as {example}, or leave it unset (null)")
    parts = _split_url(value, key)
    _refuse_credentials(parts, key, hint)
    if "://" not in value:
        raise UserError(f"{key} has no scheme: write it as a full URL such as {example}")
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        shown = f" ({scheme}://)" if re.fullmatch(r"[a-z][a-z0-9+.-]{0,9}", scheme) else ""  # a key is longer
        raise UserError(f"{key} must be an http:// or https:// URL{shown}, e.g. {example}")
    if not parts.hostname:
        raise UserError(f"{key} has no host, e.g. {example}")


def _split_url(value: str, key: str) -> SplitResult:
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise UserError(f"{key} contains whitespace or control characters")
    try:
        parts = urlsplit(value)
        _ = parts.port  # raises on a port that is not a number in 0..65535
    except ValueError:
        raise UserError(f"{key} is not a valid URL (check the host and port)") from None
    return parts


def _refuse_credentials(parts: SplitResult, key: str, hint: str, path_too: bool = True) -> None:
    """A URL is logged with the config: user:password@, a key-like query parameter or value, a
    fragment, or (path_too) a path segment that looks like a key stop the run, unechoed."""
    netloc_user = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
    if netloc_user and (path_too or ":" in netloc_user or parts.scheme.lower() in ("http", "https")):
        raise UserError(f"{key} carries credentials (user:password@host; not shown): remove them and {hint}")
    for name, val in parse_qsl(parts.query, keep_blank_values=True):
        if _is_secret_param(name) or _looks_like_key(val) or _looks_like_key(name):
            named = f" ({name}=...)" if _is_secret_param(name) and not _looks_like_key(name) else ""
            raise UserError(f"{key} carries a credential in its query{named}; not shown: remove it and {hint}")
    if path_too and parts.fragment:
        raise UserError(f"{key} must not have a #fragment (not shown): remove it")
    if path_too and any(_looks_like_key(segment) for segment in parts.path.split("/")):
        raise UserError(f"{key} has a path segment that looks like a key (not shown): remove it and {hint}")


def _is_secret_param(name: str) -> bool:
    words = name.lower().replace("-", "_").split("_")
    return bool(_SECRET_WORDS.intersection(words)) or name.lower().endswith(("key", "token", "secret", "password"))


def _looks_like_key(text: str) -> bool:
    """A provider key's well-known prefix (with the length and digits of a key, not of a name such
    as hf_token_for_ci), or a long random-looking token (mixed case and digits)."""
    text = text.strip()
    if len(text) >= 20 and text.startswith(_KEY_PREFIXES) and any(c.isdigit() for c in text):
        return True
    return (
        len(text) >= 32
        and any(c.islower() for c in text)
        and any(c.isupper() for c in text)
        and any(c.isdigit() for c in text)
    )


def _shown(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def dataset_paths(data: DataConfig) -> tuple[Path, Path, Path]:
    """(skill, results, predictions), explicit paths winning over those inside data.dir."""
    base = Path(data.dir) if data.dir else None
    # None only when data.skill and data.results are both given (_check_data)
    inside = cast(Path, base)
    skill = Path(data.skill) if data.skill else inside / "skill.md"
    if data.results:
        results = Path(data.results)
    else:
        jsonl = inside / "results.jsonl"
        results = jsonl if jsonl.exists() or not (inside / "results.json").exists() else inside / "results.json"
    if data.predictions:
        predictions = Path(data.predictions)
    else:
        predictions = (base or results.parent) / "predictions"
    return skill, results, predictions


def _price(model: str, value: Any, tier: str = "") -> Price:
    """A model's price from the config: input, cached_input and output, and optionally a tier's own
    (flex, batch, priority: each the same three amounts)."""
    key = f"optimizer.prices.{model}" + (f".{tier}" if tier else "")
    if isinstance(value, Price):
        value = {"input": value.input, "cached_input": value.cached_input, "output": value.output, "tiers": value.tiers}
    try:
        given = dict(value)
        # a tier's own price: named beside the amounts, or under `tiers` (a saved config's spelling)
        tiers = {**dict(given.pop("tiers", None) or {}), **{n: given.pop(n) for n in TIERS if n in given and not tier}}
        if set(tiers) - set(TIERS) or (tier and tiers):
            raise TypeError("unknown tier")
        price = Price(**given)
        amounts = [price.input, price.cached_input, price.output]
        if any(isinstance(a, bool) for a in amounts):
            raise ValueError("a boolean is not a price")
        amounts = [float(a) for a in amounts]
        if not all(math.isfinite(a) and a >= 0 for a in amounts):
            raise ValueError("not a finite, non-negative number")
    except (TypeError, ValueError):
        named = "" if tier else ", optionally with flex, batch or priority of the same shape"
        raise UserError(
            f"{key}: expected {{input, cached_input, output}} as finite, non-negative numbers{named}, got {value!r}"
        ) from None
    tier_prices = {name: _price(model, own, name) for name, own in tiers.items()}
    return Price(input=amounts[0], cached_input=amounts[1], output=amounts[2], tiers=tier_prices)


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


# --- What each part of a run gets (issue 38) -------------------------------------------------
# The whole ReflactConfig reaches only the entry points and this module, which records it (params,
# the saved config) and decides, for every key, whether it changes results: UNCHANGING above (a
# rerun resumes), SHAPING below (in every saved patch's fingerprint), or neither (it changes the
# messages, which the fingerprint holds whole). The parts get their sections, or a small
# dataclass made from them (tests/test_config_parts.py keeps it so).


@dataclass(frozen=True)
class Parts:
    """The checked config's sections, built once at the entry: what the run's orchestration
    (reflact.experiment) hands its parts, each the section(s) it uses."""

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


def model_priced(o: OptimizerConfig) -> bool:
    """Whether the model has a price: without one every cost is unknown (None), never $0."""
    return o.model in o.prices


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
