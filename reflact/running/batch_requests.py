"""The requests a run would make next: its conversations played as far as the response cache answers
them, nothing written and nothing sent (for reflact.running.batch).

Every minibatch is prepared as the stage prepares it (a saved patch from the same prompt is reused:
no request), then each part's conversation goes through the stage's own Asker against a
`Collector`, an Optimizer that answers from the cache and notes the request it cannot answer (the
conversation ends there, as a failed call nobody sees). A conversation whose cached replies do not
parse goes on to its re-ask, as the stage's would: what is noted is exactly what the stage will ask
for, keyed and shaped as the client will send it. All parts of a split minibatch are looked at
(the stage asks a part only after the one before it was usable: a batch sends them together).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from reflact.calls.cache import cached_reply
from reflact.calls.protocol import CallError, Optimizer, Reply
from reflact.inputs.dataset import Dataset
from reflact.prompting.plan import plan_minibatches, with_draws
from reflact.running.ask import Spend, worst_cost
from reflact.running.stage import Ready, Stage, StageSettings

if TYPE_CHECKING:  # the client comes with the OpenAI SDK: a look ahead is given one
    from reflact.calls.client import OptimizerClient

WAITING = "waiting for a batch"


@dataclass(frozen=True)
class Unit:
    """A run whose requests a batch answers: a single run, or one job of a sweep."""

    settings: StageSettings  # the run's (or job's) own
    dataset: Dataset
    run_dir: Path


@dataclass
class Request:
    """A request to send in a batch: its line's body, and what collecting its reply needs."""

    body: dict
    structured: str  # the response format the body holds, as the cache records it
    worst: float  # the most it may cost at the batch's price
    first: bool  # a conversation's first request (not a re-ask)


class Collector(Optimizer):
    """Answers from the cache (nothing used up: a batch's line stays its first user's call); notes
    every other request."""

    fault = ""

    def __init__(self, client: OptimizerClient, found: dict[str, Request]) -> None:
        self.client = client
        self.found = found  # custom_id (the cache key) -> its request, shared by a batch's runs

    def complete(
        self,
        messages: list[dict],
        max_output_tokens: int,
        schema: dict | None = None,
        sample: int | None = None,
        label: str = "",
    ) -> Reply:
        key, logical = self.client.shapes.keyed(messages, max_output_tokens, schema, sample)
        # the cache's reply not used up: a batch's line stays the call of the first run that uses it
        hit = cached_reply(self.client.cache.get(key), key) if self.client.cache else None
        if hit is not None:
            return hit
        if key not in self.found:
            body, structured = self.client.shapes.as_sent(logical, schema)
            price = self.client.cfg.prices.get(self.client.cfg.model)
            worst = worst_cost(messages, max_output_tokens, price.at("batch") if price is not None else None)
            self.found[key] = Request(body, structured, worst, first=len(messages) <= 2)
        raise CallError(WAITING)

    def forget(self, replies: list[Reply]) -> None:
        pass  # a conversation cut short here is not over: its replies stay

    def close(self) -> None:
        pass


def look_ahead(unit: Unit, collector: Collector) -> None:
    """Notes in `collector` every request the run would make next."""
    stage = Stage(unit.settings, unit.dataset, collector, unit.run_dir, observers=[])
    # the batch as a whole is held to optimizer.max_cost_usd before anything is uploaded (reflact.running.batch)
    stage.asker = replace(stage.asker, spend=Spend(None))
    o = unit.settings.optimizer
    for mb in with_draws(plan_minibatches(unit.dataset.results, unit.settings.reflect), o.samples):
        ready = stage.prepare(mb, write=False)
        if not isinstance(ready, Ready):
            continue
        sample = o.sample + mb.draw if o.samples > 1 else None
        for part, ids in zip(ready.prompt.parts, ready.prompt.ids, strict=True):
            stage.asker.ask(mb.tag, mb.group, part, 0, _unkept, ids, sample)


def _unkept(number: int, reply: Reply) -> None:
    """Nothing of a look ahead is saved: the stage saves each reply when it uses it."""
