"""Prices: whether the model has one, what to set to give it one, and a price read from the config."""

from __future__ import annotations

import math
from typing import Any

from reflact.config.schema import TIERS, OptimizerConfig, Price
from reflact.core.errors import UserError


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


def read_price(model: str, value: Any, tier: str = "") -> Price:
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
    tier_prices = {name: read_price(model, own, name) for name, own in tiers.items()}
    return Price(input=amounts[0], cached_input=amounts[1], output=amounts[2], tiers=tier_prices)


def priced(o: OptimizerConfig) -> bool:
    """Whether the model has a price: without one every cost is unknown (None), never $0."""
    return o.model in o.prices
