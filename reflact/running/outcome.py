"""What happened to one minibatch: its record in `calls/<minibatch>/outcome.json`, in the summary,
in the progress line and in MLflow."""

from __future__ import annotations

from dataclasses import dataclass, field

from reflact.calls.protocol import Usage

WITH_PATCH = ("done", "reused")  # the statuses whose minibatch has a saved patch


@dataclass
class Tally:
    """What the requests for a minibatch did and cost; the parts of a split minibatch add up."""

    calls: int = 0
    failed_calls: int = 0
    reasks: int = 0
    retries: int = 0
    cache_hits: int = 0
    usage: Usage = field(default_factory=Usage)  # tokens behind the replies, whenever they were spent
    spent_usd: float = 0.0  # what this run paid: calls made now, not cache hits
    cost_usd: float = 0.0  # what the replies cost, cache hits included (each at most its worst case)
    latency_s: float = 0.0
    call_log: list[dict] = field(default_factory=list)  # one record per request or cache hit

    def add(self, other: Tally) -> None:
        self.calls += other.calls
        self.failed_calls += other.failed_calls
        self.reasks += other.reasks
        self.retries += other.retries
        self.cache_hits += other.cache_hits
        self.usage.add(other.usage)
        self.spent_usd += other.spent_usd
        self.cost_usd += other.cost_usd
        self.latency_s = round(self.latency_s + other.latency_s, 3)
        self.call_log += other.call_log


@dataclass
class Outcome:
    tag: str
    group: str
    index: int
    ids: list[str]
    status: str = "done"  # one of STATUSES
    analysed: int = 0
    skipped: int = 0
    proposed: int = 0
    kept: int = 0
    calls: int = 0
    failed_calls: int = 0
    reasks: int = 0
    retries: int = 0
    cache_hits: int = 0
    usage: Usage = field(default_factory=Usage)
    cost_usd: float = 0.0  # what the patch cost (its usage priced)
    spent_usd: float = 0.0
    latency_s: float = 0.0
    parts: int = 1  # calls the minibatch was split into to fit the context window
    shortened: int = 0  # when items were shortened to fit: their new length in characters
    parse: str = ""  # ok, or why the last reply was not usable
    error: str = ""
    call_log: list[dict] = field(default_factory=list)

    @property
    def truncated(self) -> int:
        return self.proposed - self.kept

    def count(self, tally: Tally) -> None:
        """Take the figures of the minibatch's requests."""
        for name in ("calls", "failed_calls", "reasks", "retries", "cache_hits", "spent_usd", "cost_usd", "latency_s"):
            setattr(self, name, getattr(tally, name))
        self.usage, self.call_log = tally.usage, tally.call_log
