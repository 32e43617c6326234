"""From Hydra to typed settings: the schema and resolvers registered, a composed config typed and
checked, `key=value` settings applied as Hydra applies them, texts kept verbatim."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import fields, is_dataclass, replace
from typing import Any, cast

from reflact.config.checks import validate
from reflact.config.params import params
from reflact.config.schema import ReflactConfig
from reflact.config.unchanging import unchanging_overrides
from reflact.core.errors import UserError
from reflact.core.imports import one_at_a_time

# `${` with the backslashes before it: what OmegaConf would read as an interpolation
_INTERPOLATION = re.compile(r"(\\*)\$\{")


# config groups reflact's defaults leave out: `exp=demo` picks one as for any group, and Hydra's own
# spelling for adding a group, `+exp=demo`, works too
ADDED_GROUPS = ("exp", "cluster")


def hydra_spelling(overrides: Sequence[str]) -> list[str]:
    """The overrides with `exp=<name>` spelled `+exp=<name>` (and `cluster=`). Hydra 1.3 takes one
    spelling per group: with `exp: null` in the defaults `+exp=` fails ("Multiple values for exp"),
    without it `exp=` fails ("No match in the defaults list"). Kept out of the defaults and spelled
    `+exp=`, both work and name the job folders sweeps always had (`+exp=demo,...`)."""
    return [f"+{o}" if o.split("=", 1)[0] in ADDED_GROUPS and "=" in o else o for o in overrides]


def apply_settings(node, overrides: Sequence[str], where: str, under: tuple[str, ...] = ()) -> None:
    """`key=value` settings in the command line's grammar (Hydra's overrides: `off` is text,
    `{input:1,output:4}` a mapping, quotes and `null` as there), applied to a config node the way
    Hydra applies them: a key must exist, `+key=value` adds one, `++key=value` adds or sets one.
    Config groups, deletions (`~key`) and sweeps (`a=1,2`) are not settings; `under` limits the keys.
    A mistake names `where` (the option) and the override."""
    with one_at_a_time():
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from hydra.errors import HydraException
        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException

    for line in overrides:
        try:
            [override] = OverridesParser.create().parse_overrides([line])
        except HydraException as exc:
            raise UserError(f"{where} {line}: {' '.join(str(exc).split())[:200]}") from None
        key = override.key_or_group
        if override.is_delete() or override.is_sweep_override() or override.package is not None or "." not in key:
            raise UserError(f"{where} {line}: give one setting, KEY=VALUE (not a config group, ~ or a sweep)")
        if under and not key.startswith(under):
            raise UserError(f"{where} {line}: give a key under {' or '.join(under)}")
        value = override.value()
        if override.is_add() and OmegaConf.select(node, key, default=None) is not None and not isinstance(value, dict):
            raise UserError(f"{where} {line}: {key} is already set: drop the +, or use ++ to add or set it")
        try:
            OmegaConf.update(node, key, value, merge=True, force_add=override.is_add() or override.is_force_add())
        except OmegaConfBaseException as exc:
            raise UserError(f"{where} {line}: {str(exc.msg or exc).strip().splitlines()[0]}") from None


def register() -> None:
    """Make the schema available to conf/config.yaml's defaults list, `${shipped:demo}` to configs
    that name files shipped with reflact (the demo dataset), wherever it is installed, and
    `${unchanging:...}` to its job folder names."""
    with one_at_a_time():
        from hydra.core.config_store import ConfigStore
        from omegaconf import OmegaConf

    from reflact.core.shipped import shipped_dir

    ConfigStore.instance().store(name="reflact_schema", node=ReflactConfig)
    if not OmegaConf.has_resolver("shipped"):
        OmegaConf.register_new_resolver("shipped", lambda name: str(shipped_dir(name)))
    if not OmegaConf.has_resolver("unchanging"):
        OmegaConf.register_new_resolver("unchanging", unchanging_overrides)


def from_hydra(dict_cfg) -> tuple[ReflactConfig, dict[str, str]]:
    """The typed, checked config and its params (flat strings, as tracked) from a config Hydra
    composed or a run's saved `.hydra/config.yaml`: the one way a config becomes settings."""
    cfg = validate(typed(dict_cfg))
    return cfg, params(cfg)


def typed(dict_cfg) -> ReflactConfig:
    """The schema's dataclasses from a composed config, not yet checked (see validate)."""
    with one_at_a_time():
        from omegaconf import OmegaConf

    # a config Hydra composed is already typed by the schema; only keys added with `+`, which Hydra
    # lets through, need the merge into the schema (~50 ms) that rejects them by name
    if OmegaConf.get_type(dict_cfg) is ReflactConfig and not _added_keys(dict_cfg):
        return cast(ReflactConfig, OmegaConf.to_object(dict_cfg))
    merged = OmegaConf.merge(OmegaConf.structured(ReflactConfig), OmegaConf.to_container(dict_cfg))
    return cast(ReflactConfig, OmegaConf.to_object(merged))


def _added_keys(node) -> bool:
    """Whether a typed node, or one inside it, holds a key its dataclass has no field for (a dict,
    e.g. the price table, takes any key; its values may be typed nodes)."""
    with one_at_a_time():
        from omegaconf import DictConfig, OmegaConf

    kind = OmegaConf.get_type(node)
    names = {f.name for f in fields(kind)} if is_dataclass(kind) else None
    for key in node:
        if names is not None and key not in names:
            return True
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_none() and _added_keys(child):
            return True
    return False


def literal(value: Any) -> Any:
    """A typed config (or any value in it) whose texts OmegaConf reads back verbatim: each `${` is
    escaped, and so are the backslashes before it. A config object's texts are data (a meta skill an
    optimizer wrote, a folder named data_${x}): interpolating them could read any variable."""
    if isinstance(value, str):
        return _INTERPOLATION.sub(lambda m: m.group(1) * 2 + "\\${", value)
    if is_dataclass(value) and not isinstance(value, type):
        return replace(value, **{f.name: literal(getattr(value, f.name)) for f in fields(value)})
    if isinstance(value, list):
        return [literal(v) for v in value]
    if isinstance(value, dict):
        return {k: literal(v) for k, v in value.items()}
    return value
