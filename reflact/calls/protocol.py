"""What the stage needs of an optimizer model, and its two implementations' common data.

The stage talks to an `Optimizer`: the OpenAI-SDK client (`reflact.calls.client`) in a real run,
`DryRunEstimator` in a dry run (every prompt is built and saved, tokens and cost estimated,
nothing called). Both return a `Reply`; a call that finally failed raises `CallError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from reflact.config import OptimizerConfig, Price
from reflact.core.modes import Mode

CHARS_PER_TOKEN = 4  # a rough, offline estimate (no tokenizer download at run time)
# a dry run's guess of a reply's length: edits or suggestions are short, a full rewrite is a whole skill
DRY_RUN_REPLY_TOKENS = 1500


@dataclass
class Usage:
    prompt: int = 0
    cached: int = 0
    completion: int = 0
    reasoning: int = 0  # part of completion

    def add(self, other: Usage) -> None:
        self.prompt += other.prompt
        self.cached += other.cached
        self.completion += other.completion
        self.reasoning += other.reasoning

    def cost_usd(self, price: Price | None) -> float:
        if price is None:
            return 0.0
        fresh = max(self.prompt - self.cached, 0)
        return (fresh * price.input + self.cached * price.cached_input + self.completion * price.output) / 1e6


@dataclass
class Reply:
    text: str
    finish_reason: str | None
    usage: Usage  # the reply's tokens (for a cache hit: those of the call that made it)
    latency_s: float
    retries: int = 0
    from_cache: bool = False
    structured: str = "off"  # what was sent as response_format
    started_at: float = 0.0  # epoch seconds
    cache_key: str = ""
    estimated: bool = False  # a dry run's estimate: no text, nothing was called
    service_tier: str = ""  # the tier that served it, as the reply says ("batch" for a batch's line)
    batch_id: str = ""  # the batch that answered it
    flex_unavailable: int = 0  # flex 429s "resource unavailable" before it was answered (never billed)


@dataclass
class CallError(Exception):
    """A call that still failed after the retry policy; `cause` is a one-line description."""

    cause: str
    retries: int = 0
    # set when the endpoint itself is unusable (every call of the run would fail): why, what to check
    fatal: str = ""

    def __str__(self) -> str:
        return self.cause


class Optimizer(Protocol):
    @property
    def fault(self) -> str:  # "" until the endpoint is judged unusable; then why, and what to check
        ...

    def complete(
        self,
        messages: list[dict],
        max_output_tokens: int,
        schema: dict | None = None,
        sample: int | None = None,
        label: str = "",
    ) -> Reply:
        """The model's reply to `messages`; raises CallError when the call finally failed. `sample`
        (passed only with optimizer.samples > 1) is the draw's sample index; `label` names the
        request (its minibatch) in log lines."""

    def ready(self) -> None:
        """Makes what a request needs (the SDK client), now and on this thread. The stage calls it
        once a minibatch needs a call, before it prepares the next prompts: importing the SDK on a
        worker while this thread prepares them slows both, as they share the GIL (the first
        requests left ~0.1 s later). By default there is nothing to make."""
        return None

    def forget(self, replies: list[Reply]) -> None:
        """Replies that led nowhere: a later identical request must ask afresh."""

    def close(self) -> None:
        """Release connections and files."""


def estimate_tokens(messages: list[dict]) -> int:
    return sum(len(m["content"]) for m in messages) // CHARS_PER_TOKEN


def output_allowance(cfg: OptimizerConfig, mode: Mode) -> int:
    """The first call's output-token allowance: full rewrites are whole skills, so get more room."""
    return cfg.max_output_tokens_full_rewrite if mode.full_rewrite else cfg.max_output_tokens


class DryRunEstimator(Optimizer):
    """An optimizer that answers with an estimate: the prompt's tokens and a typical reply's."""

    fault = ""  # nothing is called, so nothing can fail

    def __init__(self, reply_tokens: int, tier: str = "") -> None:
        self.reply_tokens = reply_tokens
        self.tier = tier  # estimates are priced at the tier asked for

    def complete(
        self,
        messages: list[dict],
        max_output_tokens: int,
        schema: dict | None = None,
        sample: int | None = None,
        label: str = "",
    ) -> Reply:
        usage = Usage(prompt=estimate_tokens(messages), completion=self.reply_tokens)
        return Reply(text="", finish_reason=None, usage=usage, latency_s=0.0, estimated=True, service_tier=self.tier)

    def forget(self, replies: list[Reply]) -> None:
        pass

    def close(self) -> None:
        pass
