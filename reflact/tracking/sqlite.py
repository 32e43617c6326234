"""A local sqlite tracking store (`sqlite:///...`, reflact's default under outputs/): opened by one
process at a time, created whole or not at all, and named plainly when an earlier tool left it
half-migrated.

MLflow creates a fresh sqlite store by running its schema migrations on the file itself (about
two seconds of DDL). A process killed in the middle leaves a file that every later open fails on
(`table ... already exists`, `duplicate column name`), for good. reflact migrates a fresh store as
a copy beside it and renames the copy in, so an interruption leaves no store at all, only a copy
the next opening removes.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import unquote

from reflact.core.errors import UserError
from reflact.core.files import lock_file
from reflact.core.imports import one_at_a_time

# what MLflow says when it opens a store whose migrations were cut short, or that a newer MLflow made
HALF_MIGRATED = re.compile(r"already exists|duplicate column|_alembic_tmp_|out-of-date database schema", re.I)


class HalfMigrated(UserError):
    """A store that cannot be opened until someone repairs or removes it."""


def sqlite_path(uri: str) -> Path | None:
    """The file of a `sqlite:///` store (None for another store, or sqlite in memory)."""
    path = uri[len("sqlite:///") :].split("?", 1)[0] if uri.startswith("sqlite:///") else ""
    return Path(unquote(path)) if path and path != ":memory:" else None


@contextlib.contextmanager
def first_use(uri: str, migrating: Callable[[bool], None] | None = None) -> Iterator[None]:
    """Opening a store: a local sqlite file is opened under a lock file beside it
    (`mlflow.db.lock`), one process at a time, and a fresh one is migrated aside first
    (`migrating(True)`, then `migrating(False)`, tell whoever waits on this process). Other stores
    need none of it."""
    path = sqlite_path(uri)
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as handle:
        lock_file(handle, wait=True)
        if _fresh(path):
            announce = migrating or (lambda _: None)
            announce(True)
            try:
                migrate_aside(path)
            finally:
                announce(False)
        yield


def _fresh(path: Path) -> bool:
    """No store yet: no file, or an empty one (sqlite makes the file before the first table)."""
    try:
        return path.stat().st_size == 0
    except FileNotFoundError:
        return True


def migrate_aside(path: Path) -> None:
    """MLflow's schema, made in a copy beside `path` and renamed onto it once whole. The caller holds
    the store's lock: a copy left by a killed process is no one's, and goes."""
    for stale in path.parent.glob(f".{path.name}.*.migrating"):
        stale.unlink(missing_ok=True)
    aside = path.with_name(f".{path.name}.{os.getpid()}.migrating")
    with one_at_a_time():
        from mlflow.store.db.utils import _initialize_tables, create_sqlalchemy_engine_with_retry

    engine = create_sqlalchemy_engine_with_retry(f"sqlite:///{aside}")
    try:
        _initialize_tables(engine)
    finally:
        engine.dispose()
    os.replace(aside, path)


def opening_failed(uri: str, exc: BaseException) -> None:
    """Raises HalfMigrated, one line saying what to do, when `exc` (raised opening `uri`) comes from a
    local store whose migrations were cut short; returns otherwise (the caller's failure stands)."""
    path = sqlite_path(uri)
    if path is None or not HALF_MIGRATED.search(str(exc)):
        return
    runs = _runs_in(path)
    if runs == 0:
        todo = f"it holds no runs: remove it (and {path.name}.lock) and run again"
    else:
        held = "some runs" if runs is None else f"{runs} runs"
        todo = f"it holds {held}: back it up, then run `mlflow db upgrade {uri}`"
    raise HalfMigrated(f"half-migrated store {path}: its creation or upgrade was cut short; {todo}") from None


def _runs_in(path: Path) -> int | None:
    """How many runs the file holds, read without MLflow (None when that cannot be read)."""
    try:
        with contextlib.closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)) as db:
            if db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'runs'").fetchone() is None:
                return 0
            return int(db.execute("SELECT count(*) FROM runs").fetchone()[0])
    except sqlite3.Error:
        return None
