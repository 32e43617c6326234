"""Atomic file writes: a kill at any moment leaves either the old file or the new one."""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, TextIO


@contextmanager
def atomic_writer(path: Path, durable: bool = False) -> Iterator[TextIO]:
    """A handle to write `path` piece by piece; the file appears whole when the block ends.

    The rename alone survives a killed process; `durable` also survives a power cut (an
    fsync, a few ms on a busy disk: kept for paid-for results, not for files we can rebuild).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            yield handle
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str, durable: bool = False) -> None:
    with atomic_writer(path, durable) as handle:
        handle.write(text)


def write_json(path: Path, obj: object, durable: bool = False, indent: int | None = 2) -> None:
    write_text(path, json.dumps(obj, ensure_ascii=False, indent=indent) + "\n", durable)


def read_json(path: Path) -> object | None:
    """The file's JSON, or None when it is missing or unreadable (then it is simply redone)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
