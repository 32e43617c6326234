"""reflact: the reflect stage of skill optimisation as a configured, logged experiment."""

from functools import cache


def __getattr__(name: str):
    """`reflact.reflect`, `reflact.Reflection`, the errors it raises (`reflact.UserError`,
    `reflact.Stopped`) and `reflact.__version__`, on first use: `import reflact` stays light, and
    the command line starts its tracker process before any import."""
    if name in ("reflect", "Reflection"):
        from reflact import api

        return getattr(api, name)
    if name in ("UserError", "Stopped"):  # what reflect() raises, for a caller to catch
        from reflact.core import errors

        return getattr(errors, name)
    if name == "__version__":
        return _installed_version()
    raise AttributeError(f"module 'reflact' has no attribute {name!r}")


@cache  # the installed metadata is read once per process, not at each run's tags
def _installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("reflact")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "0+unknown"
