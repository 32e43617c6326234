"""`python -m reflact.run --help`: what to type, the shipped config groups, and the config.

Hydra's own help lists the groups by composing the whole config once per group and option (about
a second); the groups are folders of the shipped conf/, so they are read from there. Hydra's
help stays one flag away (--hydra-help).
"""

from __future__ import annotations

from collections.abc import Sequence

from reflact.core.imports import one_at_a_time
from reflact.core.shipped import conf_dir

FLAGS = ("--help", "-h")
# with these Hydra reads configs of the user's own, which only its own help knows about
OWN_CONFIGS = ("--config-dir", "-cd", "--config-path", "-cp", "--config-name", "-cn", "hydra.searchpath")

HEADER = """reflact: the reflect stage of skill optimisation, as a configured experiment.

  python -m reflact.run +exp=demo                     one run (outputs under outputs/)
  python -m reflact.run -m +exp=demo reflect.minibatch_size=4,8 reflect.edit_budget=2,4
                                                      a sweep, one job per cell
  mlflow ui --backend-store-uri sqlite:///outputs/mlflow.db
                                                      the dashboard
"""
FOOTER = "Hydra's own options (--cfg, --multirun, launchers...): --hydra-help"


def wanted(args: Sequence[str]) -> bool:
    """Whether the command line asks for this help (and not for Hydra's, with configs of its own)."""
    return any(a in FLAGS for a in args) and not any(a.split("=", 1)[0].lstrip("+~") in OWN_CONFIGS for a in args)


def help_text(args: Sequence[str]) -> str:
    """The help, its config composed with the command line's overrides (its flags left out)."""
    with one_at_a_time():
        from omegaconf import OmegaConf

    from reflact.api import composed

    cfg = composed([a for a in args if not a.startswith("-")])
    return "\n".join(
        [
            HEADER,
            "== Configuration groups ==",
            "Pick an option of a group with group=option",
            "",
            groups(),
            "",
            "== Config ==",
            "Override anything in it with key=value",
            "",
            OmegaConf.to_yaml(cfg),
            FOOTER,
        ]
    )


def groups() -> str:
    root = conf_dir()
    lines = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and p.name != "hydra"):
        options = sorted(f.stem for f in folder.glob("*.yaml"))
        lines.append(f"{folder.name}: {', '.join(options)}")
    return "\n".join(lines)
