"""The process's one import lock, for imports made after start-up.

reflact imports its heavy libraries where they are used, so that start-up and `--help` stay fast,
and some of them on its own threads (the MLflow tracker, the analysis warm-up) while the main
thread may be importing too. Two threads importing one package at once can deadlock inside
Python's import machinery, which breaks the tie by handing one of them a half-made module
(`partially initialized module 'rapidfuzz.process' has no attribute 'cdist'`). So every deferred
import of another package is written inside `with one_at_a_time():`, and a thread of reflact's
that may import while it works (the tracker) holds the lock while it works. tests/test_imports.py
checks both: the import statements in the code, and every module loaded during real runs.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

_LOCK = threading.RLock()  # reentrant: a tracker holding it may reach a deferred import


@contextmanager
def one_at_a_time() -> Iterator[None]:
    """Imports (and code that may import) inside this block run one thread at a time."""
    with _LOCK:
        yield


def held() -> bool:
    """Whether the current thread holds the lock (the tests' audit of every module loaded)."""
    return _LOCK._is_owned()  # type: ignore[attr-defined]  # the C RLock has it; no public equivalent


def resolve_lazy(module: ModuleType) -> None:
    """Loads every name a lazily importing package (anyio) offers, so that none of them is first
    loaded later on a thread that cannot take the lock (an event loop deep in a request)."""
    with one_at_a_time():
        for name in dir(module):
            getattr(module, name, None)
