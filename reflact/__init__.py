"""reflact: the reflect stage of skill optimisation as a configured, logged experiment."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("reflact")
except PackageNotFoundError:  # run from a checkout that was never installed
    __version__ = "0+unknown"
