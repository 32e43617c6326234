"""The settings as params: flat `section.key` strings, as a run's tracking records them."""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from enum import Enum
from typing import cast

from reflact.config.schema import Provider, ReflactConfig


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
