"""The config schema: the dataclasses Hydra's ConfigStore holds, their enums, and a comment on
every key (docs/keys.py makes docs/keys.md of them).

Hydra rejects unknown keys and wrong types at compose time because every group merges into
these typed nodes; `validate` (checks.py) adds the range and choice checks and names the key at fault.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


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
