"""A judge for what embeddings cannot tell: the embedding neighbours of each block (cosine at least
`analysis.judge.candidate_threshold`, past the guards) are put to the optimizer model, a batch of
pairs per question, and only the pairs it calls the same change match.

The questions go through the stage's client (reflact.calls.client: retries, rate limits, the response
cache), each counted and bounded by what is left of `optimizer.max_cost_usd`; every reply is kept
as `judge_NNN.json` (messages, reply, usage) in the run dir's `calls/analysis_judge/`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reflact.analysis.embedding import AnalysisUnavailable, EmbeddingMatcher, Spent, reserve_or_stop
from reflact.analysis.matching import Key
from reflact.config import Price
from reflact.core.imports import one_at_a_time

log = logging.getLogger("reflact")
MARKER = "## Same-change judge"  # the system prompt's heading (the tests' server answers by it)
SYSTEM = f"""{MARKER}

You compare proposed changes to an agent's skill file. For each numbered pair, say whether A and B
make the same change to the skill: the same rule or step, on the same target, with the same numbers
and the same polarity, in whatever words. Two changes on one topic that differ in what they ask
(another number, a negation, another target, another action) are not the same.

Reply with only a JSON object: {{"same": [true, false, ...]}}, one boolean per pair, in order."""
SCHEMA = {
    "type": "object",
    "properties": {"same": {"type": "array", "items": {"type": "boolean"}}},
    "required": ["same"],
}


@dataclass
class JudgeMatcher:
    candidates: EmbeddingMatcher
    client: Any  # reflact.calls.client.OptimizerClient
    price: Price | None
    spend: Any  # reflact.running.ask.Spend, shared with the embeddings
    batch: int
    max_output_tokens: int
    raw_dir: Path | None
    spent: Spent
    name = "judge"

    def chunks(self, keys: list[Key | None]):
        with one_at_a_time():
            import numpy as np

        found = list(self.candidates.chunks(keys))
        a = np.concatenate([x for x, _ in found]) if found else np.zeros(0, dtype=np.int64)
        b = np.concatenate([y for _, y in found]) if found else np.zeros(0, dtype=np.int64)
        same = np.zeros(len(a), dtype=bool)
        for start in range(0, len(a), self.batch):
            here = slice(start, start + self.batch)
            pairs = [(keys[i], keys[j]) for i, j in zip(a[here], b[here], strict=True)]
            same[start : start + len(pairs)] = self._ask(pairs, start // self.batch + 1)
        yield a[same], b[same]

    def describe(self) -> dict:
        return {
            **self.candidates.describe(),
            "matcher": self.name,
            "model": getattr(self.client.cfg, "model", None),
            "candidate_threshold": self.candidates.threshold,
        }

    def _ask(self, pairs: list[tuple[Key, Key]], number: int) -> list[bool]:
        from reflact.calls.protocol import CallError
        from reflact.running.ask import capped_cost, worst_cost

        lines = [f"### Pair {n}\nA: {x.meaning}\nB: {y.meaning}" for n, (x, y) in enumerate(pairs, 1)]
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n\n".join(lines)}]
        worst = worst_cost(messages, self.max_output_tokens, self.price)
        reserve_or_stop(self.spend, worst, "judge's questions", "embedding")
        cost = 0.0
        try:
            reply = self.client.complete(messages, self.max_output_tokens, SCHEMA)
            # as in the stage: a reply never costs more than its request could (usage is the server's claim)
            cost = 0.0 if reply.from_cache else capped_cost(reply.usage.cost_usd(self.price), worst, "a judge's reply")
        except CallError as exc:
            raise AnalysisUnavailable(
                f"analysis.matcher=judge: a question to the optimizer failed: {exc.cause}"
            ) from None
        finally:
            self.spend.settle(worst, cost)
        self._count(reply, cost)
        self._keep(number, messages, reply)
        return _verdicts(reply.text, len(pairs))

    def _count(self, reply, cost: float) -> None:
        if reply.from_cache:
            self.spent.cache_hits += 1
            return
        self.spent.requests += 1
        self.spent.tokens += reply.usage.prompt + reply.usage.completion
        self.spent.cost_usd += cost

    def _keep(self, number: int, messages: list[dict], reply) -> None:
        from reflact.core.files import write_json

        if self.raw_dir is not None:
            self.raw_dir.mkdir(parents=True, exist_ok=True)
            write_json(
                self.raw_dir / f"judge_{number:03d}.json",
                {
                    "messages": messages,
                    "reply": reply.text,
                    "from_cache": reply.from_cache,
                    "usage": {"prompt": reply.usage.prompt, "completion": reply.usage.completion},
                },
            )


def _verdicts(text: str, n: int) -> list[bool]:
    """The reply's booleans; an unreadable reply or a wrong count confirms none (with a warning)."""
    from reflact.replies.parse import ParseError, extract_object

    try:
        same = extract_object(text).get("same")
    except (ParseError, AttributeError, json.JSONDecodeError):
        same = None
    if isinstance(same, list) and len(same) == n and all(isinstance(v, bool) for v in same):
        return same
    log.warning('analysis: a judge reply was not %d booleans under "same"; its pairs count as different', n)
    return [False] * n
