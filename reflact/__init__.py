"""reflact: the reflect stage of skill optimisation as a configured, logged experiment."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("reflact")
except PackageNotFoundError:  # run from a checkout that was never installed
    __version__ = "0+unknown"


def __getattr__(name: str):
    """`reflact.reflect` and `reflact.Reflection`, imported on first use (`import reflact` stays light)."""
    if name in ("reflect", "Reflection"):
        from reflact import api

        return getattr(api, name)
    raise AttributeError(f"module 'reflact' has no attribute {name!r}")
