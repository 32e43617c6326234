"""What the stage tells its observers while it runs (progress display, live tracking).

The stage publishes; observers are plain callables taking one event. They are called on the
stage's threads, so they must be quick and thread-safe: anything slow (MLflow) goes through a
queue of its own. The run dir, written by the stage itself, stays the record of truth.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from reflact.calls.protocol import Reply
from reflact.prompting.plan import Minibatch
from reflact.running.outcome import Outcome

log = logging.getLogger("reflact")


@dataclass(frozen=True)
class Planned:
    """The stage's plan, before anything is prepared or called."""

    plan: list[Minibatch]


@dataclass(frozen=True)
class CallStarted:
    tag: str
    number: int  # the request's number within its minibatch (reply_<number>.txt), from 1


@dataclass(frozen=True)
class Replied:
    """A request ended: with a reply (or a cache hit, or a dry run's estimate) or an error."""

    tag: str
    number: int
    messages: list[dict]  # exactly what was sent
    reply: Reply | None
    error: str = ""
    cost_usd: float = 0.0  # what this request cost now (0 for a cache hit)
    ended_at: float = field(default_factory=time.time)  # epoch seconds


@dataclass(frozen=True)
class MinibatchEnded:
    """A minibatch is settled: a patch saved (done), reused, failed, skipped, not run or estimated."""

    outcome: Outcome
    patch: dict | None = None  # the saved patch, for done and reused


@dataclass(frozen=True)
class EndpointFailed:
    """The optimizer's endpoint is unusable (no connection, a refused key, no such model): every
    call of the run fails with the same cause. Published with each call it fails."""

    message: str  # why, and what to check


@dataclass(frozen=True)
class BatchNoted:
    """The run's batches (reflact.running.batch) as they stand: each one's id, status, request
    counts, status times and usage (BatchState's notes). Published while the run waits for them."""

    batches: list[dict]
    step: int  # counted over the commands that waited for them (the metrics' step)


Event = Planned | CallStarted | Replied | MinibatchEnded | EndpointFailed | BatchNoted
Observer = Callable[[Event], None]


class Publisher:
    def __init__(self, observers: list[Observer] | None = None) -> None:
        self.observers = list(observers or [])

    def __call__(self, event: Event) -> None:
        for observer in self.observers:
            try:
                observer(event)
            except Exception:  # an observer's bug must not cost a call or a patch
                log.exception("an observer failed on %s; the run goes on", type(event).__name__)
