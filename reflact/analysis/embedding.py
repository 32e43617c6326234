"""Matching by meaning: items whose changes' embeddings are at least `analysis.embedding.threshold`
cosine-similar match (within a block, and when reflact.analysis.guards let them).

The vectors come from any OpenAI-compatible `/v1/embeddings` (`analysis.embedding.*`; the base URL
and key default to the optimizer's), through the OpenAI SDK: the distinct texts in batches, each
text's vector kept in the response cache under the endpoint, model and text (a re-analysis, or
another run with the same items, asks for none again), the tokens and cost counted and every
request bounded by what is left of `optimizer.max_cost_usd` and costing at most its worst case. A
server without embeddings (HTTP 404) is one line, not a traceback. A reply is read from its body
(reflact.analysis.vectors; its usage as the stage reads it), never trusted as it comes: one that
cannot be used, or vectors of two dimensions in one analysis, leave the analysis out.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, cast

from reflact.analysis.guards import passing
from reflact.analysis.matching import Key, blocks_of
from reflact.analysis.vectors import Damaged, reply_rows, unit_rows
from reflact.calls.cache import ResponseCache, cache_key
from reflact.config import Price, RetryConfig
from reflact.core.errors import UserError
from reflact.core.imports import one_at_a_time

log = logging.getLogger("reflact")
CELLS_PER_CHUNK = 2_000_000  # similarities computed at once


class AnalysisUnavailable(UserError):
    """The analysis's calls cannot be made (no embeddings there, the cost cap, a failed call)."""


@dataclass
class Spent:
    """What the analysis's requests cost, beside the stage's."""

    requests: int = 0
    cache_hits: int = 0  # texts (embeddings) or batches (judge) the cache answered
    tokens: int = 0
    cost_usd: float = 0.0

    def as_dict(self) -> dict:
        return {
            "requests": self.requests,
            "cache_hits": self.cache_hits,
            "tokens": self.tokens,
            "cost_usd": round(self.cost_usd, 6),
        }


@dataclass
class Embedder:
    """Unit vectors for texts from one endpoint and model; one dimension per analysis."""

    sdk: Any  # openai.OpenAI
    model: str
    endpoint: dict  # which server answers: part of the cache key
    cache: ResponseCache | None
    price: Price | None
    spend: Any  # reflact.running.ask.Spend: the cap shared with the judge
    retry: RetryConfig
    batch: int = 64
    secret: str = ""
    spent: Spent = field(default_factory=Spent)
    warned: set[str] = field(default_factory=set)  # the usage fields already warned about

    def vectors(self, texts: list[str]):
        """One row per text (float32, unit length); each distinct text asked for once."""
        with one_at_a_time():
            import numpy as np

        distinct = list(dict.fromkeys(texts))
        found = self._cached(distinct)
        self.spent.cache_hits += len(found)
        dimension = self._dimension(found.values(), None, distinct)
        missing = [text for text in distinct if text not in found]
        for start in range(0, len(missing), self.batch):
            part = missing[start : start + self.batch]
            rows = self._ask(part)
            dimension = self._dimension(rows, dimension, distinct)
            found.update(zip(part, rows, strict=True))
        if not texts:
            return np.zeros((0, 1), dtype=np.float32)
        return np.stack([found[text] for text in texts])

    def _key(self, text: str) -> str:
        return cache_key({"embedding": self.model, "endpoint": self.endpoint, "input": text})

    def _cached(self, texts: list[str]) -> dict[str, Any]:
        """The texts the cache holds a usable vector for (a damaged entry is a miss), as unit rows."""
        if not self.cache:
            return {}
        entries = [self.cache.get(self._key(text)) for text in texts]
        rows = unit_rows([entry.get("vector") if entry else None for entry in entries])
        return {text: row for text, row in zip(texts, rows, strict=True) if row is not None}

    def _dimension(self, rows, known: int | None, texts: list[str]) -> int | None:
        """The analysis's one dimension, so far; vectors of two dimensions cannot be compared: the
        analysis is left out, and its texts' cached vectors dropped so that a new analysis asks again."""
        lengths = {len(row) for row in rows} | ({known} if known is not None else set())
        if len(lengths) > 1:
            if self.cache:
                self.cache.forget([self._key(text) for text in texts])
            raise AnalysisUnavailable(
                f"analysis.embedding: {self.model!r} gave vectors of {' and '.join(map(str, sorted(lengths)))} "
                "numbers in one analysis (its dimension changed between requests, or the response cache held "
                "vectors of another model by that name); those cached vectors are dropped, so a new analysis "
                "asks for them again"
            )
        return next(iter(lengths), None)

    def _ask(self, texts: list[str]) -> list[Any]:
        """The texts' vectors from one request, cached; its cost counted, at most its worst case."""
        from reflact.calls.completion import read_usage
        from reflact.running.ask import capped_cost

        per_token = (self.price.input if self.price else 0.0) / 1e6
        worst = sum(len(t.encode("utf-8")) + 8 for t in texts) * per_token
        reserve_or_stop(self.spend, worst, "embedding requests", "lexical")
        cost = 0.0
        try:
            body = self._body(texts)
            # the stage's rule for usage: an unreadable count is 0 (warned), a claim past the worst case is capped
            tokens = read_usage(body.get("usage"), self._warn).prompt
            cost = capped_cost(tokens * per_token, worst, "an embeddings reply")
            self.spent.requests, self.spent.tokens = self.spent.requests + 1, self.spent.tokens + tokens
            self.spent.cost_usd += cost
            raw, rows = reply_rows(body, len(texts))
        except Damaged as exc:
            where = self.endpoint.get("base_url", "")
            raise AnalysisUnavailable(f"analysis.embedding: the reply from {where} is damaged: {exc}") from None
        finally:
            self.spend.settle(worst, cost)
        if self.cache:
            for text, vector in zip(texts, raw, strict=True):
                self.cache.put(self._key(text), {"vector": vector})
        return rows

    def _body(self, texts: list[str]) -> dict:
        """The reply's JSON object; one line naming the setting when the request failed."""
        from reflact.calls.client import describe_error
        from reflact.calls.completion import MalformedReply, parse_body

        try:
            content = self._create(texts)
        except Exception as exc:  # one line naming the setting, whatever the SDK raised
            raise AnalysisUnavailable(self._why(exc, describe_error(exc, self.secret))) from None
        try:
            return parse_body(content)
        except MalformedReply as exc:
            raise Damaged(str(exc)) from None

    def _warn(self, field: str, what: str) -> None:
        if field not in self.warned:  # once per field, as the stage's client does
            self.warned.add(field)
            log.warning("analysis.embedding: the reply's %s %s (token and cost totals may be off)", field, what)

    def _create(self, texts: list[str]):
        """One request, with the stage's retry policy (429 with Retry-After, 5xx, timeouts)."""
        with one_at_a_time():
            from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_before_delay

        from reflact.calls.client import is_transient, wait_after

        stop = stop_after_attempt(self.retry.max_attempts) | stop_before_delay(self.retry.max_seconds)
        retrying = Retrying(
            retry=retry_if_exception(is_transient),
            reraise=True,
            stop=stop,
            wait=wait_after(self.retry.initial_wait_s, self.retry.max_wait_s),
        )
        for attempt in retrying:
            with attempt:  # the body as sent: read by reflact.analysis.vectors, not the SDK
                raw = self.sdk.embeddings.with_raw_response.create(
                    model=self.model, input=texts, encoding_format="float"
                )
                return raw.http_response.content

    def _why(self, exc: Exception, described: str) -> str:
        where = self.endpoint.get("base_url", "")
        if getattr(exc, "status_code", None) == 404:
            return (
                f"analysis.embedding: {where} has no embeddings for model {self.model!r} (HTTP 404 on "
                "/embeddings): set analysis.embedding.base_url and .model to a server that serves them, or "
                "analysis.matcher=lexical"
            )
        return f"analysis.embedding: the request to {where} failed: {described}"


@dataclass
class EmbeddingMatcher:
    """Items match when their changes' embeddings are at least `threshold` similar (cosine) and
    the guards named let them."""

    embedder: Embedder
    threshold: float
    guards: tuple[str, ...] = ()
    name = "embedding"

    def chunks(self, keys: list[Key | None]):
        with one_at_a_time():
            import numpy as np

        present = [i for i, key in enumerate(keys) if key is not None]
        row = {index: n for n, index in enumerate(present)}
        vectors = self.embedder.vectors([key.meaning for key in keys if key is not None])
        for members in blocks_of(keys):
            positions = np.asarray(members)
            block = vectors[[row[i] for i in members]]
            for a, b in _similar(block, self.threshold):
                if self.guards:
                    members_keys = cast("list[Key]", [keys[i] for i in members])
                    keep = passing(members_keys, self.guards, a, b, self.embedder.vectors)
                    a, b = a[keep], b[keep]
                yield positions[a], positions[b]

    def describe(self) -> dict:
        return {
            "matcher": self.name,
            "threshold": self.threshold,
            "guards": list(self.guards),
            "matching": f"cosine of {self.embedder.model} embeddings ({self.embedder.endpoint.get('base_url')})",
        }


def _similar(vectors, threshold: float):
    """The pairs (i < j) of rows at least `threshold` cosine-similar, a chunk of rows at a time."""
    with one_at_a_time():
        import numpy as np

    n = len(vectors)
    rows = max(16, min(1024, CELLS_PER_CHUNK // max(n, 1)))
    for start in range(0, n, rows):
        scores = vectors[start : start + rows] @ vectors[start:].T
        r, c = np.nonzero(scores >= threshold - 1e-6)  # a text against itself is 1 up to rounding
        later = c > r
        yield start + r[later], start + c[later]


def reserve_or_stop(spend, worst: float, what: str, instead: str) -> None:
    """Reserves the analysis calls' worst case under the cost cap, or says what to change."""
    if not spend.reserve(worst, threading.Event()):
        raise AnalysisUnavailable(
            f"analysis: the cost limit optimizer.max_cost_usd leaves no room for the {what}; raise it or use "
            f"analysis.matcher={instead}"
        )
