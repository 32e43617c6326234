"""Embedding vectors read without trusting them (for reflact.analysis.embedding): a reply's rows and
the response cache's entries count only as non-empty lists of finite numbers, each kept as a
float32 unit row. A NaN or infinite vector is a damaged reply, never used or cached: matched as it
came, it would match nothing and be cached for every later analysis."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from reflact.core.imports import one_at_a_time


class Damaged(Exception):
    """An embeddings reply that cannot be used; the message says why."""


def unit_rows(values: Sequence[object]) -> list[Any]:
    """Each value as a float32 unit vector; None for one that is not a non-empty list of finite
    numbers (NaN, infinity, text, null, nested lists)."""
    with one_at_a_time():
        import numpy as np

    return [_unit(np, value) for value in values]


def _unit(np: Any, value: object) -> Any:
    if not isinstance(value, list) or not value:
        return None
    try:
        array = np.array(value)
    except (ValueError, TypeError, OverflowError):  # ragged rows, numbers past any machine type
        return None
    if array.ndim != 1 or array.dtype.kind not in "iuf" or not np.isfinite(array).all():
        return None
    array = array.astype(np.float64)
    # scaled first: numbers past float32's range (or whose squares pass float64's) stay finite
    array /= max(float(np.abs(array).max()), float(np.finfo(np.float64).tiny))
    return (array / max(float(np.linalg.norm(array)), 1e-12)).astype(np.float32)


def reply_rows(body: dict, n: int) -> tuple[list, list[Any]]:
    """(the reply's `n` embeddings as sent, for the cache; as unit rows), in the order of the texts.
    Damaged when the reply is not that: another count, rows without their indexes, an embedding
    that is not finite numbers, embeddings of unequal lengths."""
    data = body.get("data")
    if not isinstance(data, list) or len(data) != n:
        got = len(data) if isinstance(data, list) else "no list of"
        raise Damaged(f"the server returned {got} embeddings for {n} texts")
    indexes = [row.get("index") if isinstance(row, dict) else None for row in data]
    if not all(type(i) is int for i in indexes) or sorted(indexes) != list(range(n)):  # type: ignore[type-var]
        raise Damaged(f"its rows are not indexed 0 to {n - 1}")
    sent = dict(zip(indexes, (row.get("embedding") for row in data), strict=True))
    raw = [sent[i] for i in range(n)]
    rows = unit_rows(raw)
    if any(row is None for row in rows):
        raise Damaged("an embedding is not a list of finite numbers (NaN, infinity, text or empty)")
    lengths = sorted({len(row) for row in rows})
    if len(lengths) > 1:
        raise Damaged(f"its embeddings have unequal lengths ({', '.join(map(str, lengths))} numbers)")
    return raw, rows
