"""Atomic file writes: a kill at any moment leaves either the old file or the new one.

Files are created the way a plain open() creates them (mode 0666 less the umask) and folders the
way mkdir does (0777 less the umask), so whoever may read the launch folder, a shared MLflow UI
say, may read the outputs too; a umask of 077 keeps them private. A full disk or quota ends the
write with a one-line `DiskFull` (a user mistake: exit code 2) and leaves the old file whole.

Text that UTF-8 cannot encode (lone surrogates: half an emoji, "\\ud83d" in a JSON reply, an
API result or an imported log) is repaired as it is written, never a crash: a high and low half
side by side become their character, a lone half becomes U+FFFD (`repair_text`).
"""

from __future__ import annotations

import codecs
import errno
import filecmp
import json
import os
import re
import secrets
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from reflact.core.errors import UserError

# errno -> how the one-line message starts
_FULL = {errno.ENOSPC: "no space left on the device"}
if hasattr(errno, "EDQUOT"):
    _FULL[errno.EDQUOT] = "the disk quota is exceeded"


_SURROGATE = re.compile("[\ud800-\udfff]")
_REPAIR = "reflact-repair"  # the codec error handler every text file is written with


def repair_text(text: str) -> str:
    """`text` with its surrogates made writable: pairs joined, lone halves U+FFFD (a no-op, and
    cheap, for text that has none)."""
    if not _SURROGATE.search(text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def _repair_on_write(error: UnicodeError) -> tuple[bytes, int]:
    if not isinstance(error, UnicodeEncodeError):
        raise error
    # as bytes: the UTF-8 encoder takes only ASCII back as text
    return repair_text(error.object[error.start : error.end]).encode("utf-8"), error.end


codecs.register_error(_REPAIR, _repair_on_write)


class DiskFull(UserError):
    """A write failed for want of space or quota; the user frees some and reruns the same run dir."""

    def __init__(self, path: Path, code: int) -> None:
        super().__init__(f"{_FULL[code]} writing {path}: free space and rerun with the same hydra.run.dir")
        self.path, self.code = path, code

    def __reduce__(self):  # so it crosses a process boundary (a launcher's worker) whole
        return DiskFull, (self.path, self.code)


def _create_temp(path: Path) -> tuple[int, Path]:
    """A new, empty temporary file beside `path`: (fd, its path). O_EXCL with a random name is
    what mkstemp does, but with mode 0666, so the kernel applies the umask (mkstemp forces 0600)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary file name", str(path.parent))


def usable_folder(path: Path, name: str) -> Path:
    """A folder a command may make or use (a run dir, a report's --out): neither it nor the nearest
    folder above it that exists is a file; `name` says which argument or option gave it."""
    existing = next((p for p in [path, *path.parents] if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise UserError(f"{name}: {existing} is a file, not a folder")
    return path


@contextmanager
def atomic_writer(path: Path, durable: bool = False) -> Iterator[TextIO]:
    """A handle to write `path` piece by piece; the file appears whole when the block ends.

    The rename alone survives a killed process; `durable` also survives a power cut (an
    fsync, a few ms on a busy disk: kept for paid-for results, not for files we can rebuild).
    A file already holding the same bytes is left as it is: a rerun that changes nothing then
    changes no file (and an artifact store's hard links to it still share its bytes).
    """
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = _create_temp(path)
        with os.fdopen(fd, "w", encoding="utf-8", errors=_REPAIR) as handle:
            yield handle
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        if path.is_file() and filecmp.cmp(tmp, path, shallow=False):
            Path(tmp).unlink()
        else:
            os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in _FULL:
            raise DiskFull(path, exc.errno) from None
        raise


def write_text(path: Path, text: str, durable: bool = False) -> None:
    with atomic_writer(path, durable) as handle:
        handle.write(text)


def write_json(path: Path, obj: object, durable: bool = False, indent: int | None = 2) -> str:
    """Writes `obj` as JSON; returns that JSON as built, before write_text repaired any surrogate."""
    text = json.dumps(obj, ensure_ascii=False, indent=indent)
    write_text(path, text + "\n", durable)
    return text


def read_json(path: Path) -> object | None:
    """The file's JSON, or None when it is missing or unreadable (then it is simply redone)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # RecursionError: nested deeper than json can read
        return None


def lock_file(handle, wait: bool = False) -> None:
    """An exclusive lock on an open file, released when the file is closed; OSError at once when
    another process holds it, unless `wait`. Chosen by platform, so that `import reflact` works on
    Windows too (no fcntl there)."""
    if sys.platform == "win32":
        import msvcrt

        handle.seek(0)
        msvcrt.locking(handle.fileno(), msvcrt.LK_LOCK if wait else msvcrt.LK_NBLCK, 1)
    else:
        import fcntl

        fcntl.flock(handle, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
