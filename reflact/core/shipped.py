"""Where the files shipped with reflact live: the Hydra configs, the analyst templates, the demo
dataset, the labelled matcher pairs.

The repository keeps them at its top (`conf/`, `prompts/`, `examples/demo/`), where users and the
README point. A wheel carries them inside the package instead, as `reflact/_conf`,
`reflact/_prompts` and `reflact/_demo` (pyproject.toml maps the folders to these sub-packages).
A checkout, or an editable install of one, has no such folders in `reflact/`, so the repository's
own are used. This module is the one place that knows both layouts.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from reflact.core.errors import UserError

# name -> (folder inside the installed package, folder in the repository)
_LOCATIONS = {
    "conf": ("_conf", "conf"),
    "prompts": ("_prompts", "prompts"),
    "demo": ("_demo", "examples/demo"),
    "pairs": ("_pairs", "bench/data"),  # the labelled matcher pairs (reflact.analysis.trust)
}


def shipped_dir(name: str) -> Path:
    """The folder holding the shipped `conf`, `prompts`, `demo` or `pairs` files.

    The packaged copy wins, and the repository's only counts beside a pyproject.toml: next to
    an installed package (in site-packages) a folder named `conf` may belong to anything. When
    neither exists the packaged path is returned, so the error the caller reports names where
    the files should have been.
    """
    if name not in _LOCATIONS:  # `${shipped:<name>}` in a config
        raise UserError(f"shipped: no shipped folder {name!r}; choose one of {', '.join(_LOCATIONS)}")
    inside, in_repo = _LOCATIONS[name]
    # Hydra and the dataset reader need real folders; pip always unpacks wheels, so the
    # package is a directory on disk and files() gives a pathlib.Path
    package = Path(str(files("reflact")))
    packaged = package / inside
    if packaged.is_dir():
        return packaged
    # a checkout: reflact/ beside the project's pyproject.toml and its folders
    checkout = package.parent / in_repo
    if checkout.is_dir() and (package.parent / "pyproject.toml").is_file():
        return checkout
    return packaged


def conf_dir() -> Path:
    return shipped_dir("conf")


def prompts_dir() -> Path:
    return shipped_dir("prompts")


def demo_dir() -> Path:
    return shipped_dir("demo")
