"""A single run's dir: made and held by the run, and removed again when a mistake stops the run
before any call, but only the folders this process made.

Hydra makes the run dir before the job starts, so each mistaken command would leave an empty
folder behind. `FreshRunDir`, a Hydra callback, makes it first, on the normalised path, and hands
Hydra that path (so `new/../mine` never makes `new/`). It notes each folder it made by identity
(device and inode, the folder kept open from its making, so that no other folder can take that
inode), and the run holds its run dir with a shared lock from then on, whether it made it or not.
On a user mistake the job removes what this process made, and only when each folder is still the
one made, no other run holds the run dir (an exclusive lock is granted at once) and the run dir
holds nothing but what this process put there (Hydra's log). What was made is known from this
process's memory, never from the environment. Where a folder cannot be held open (Windows),
nothing is removed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, read_write

from reflact.config import literal
from reflact.core.errors import UserError, exits_on_user_error, user_error_message

if sys.platform != "win32":
    import fcntl

CAN_HOLD = sys.platform != "win32"  # Windows opens no folder and has no flock
ATTEMPTS = 20  # a run dir removed by another run's mistake while this one waited: made again
_FOLDER = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)


@dataclass
class Made:
    """A folder this process made, held open from its making (its inode cannot become another's)."""

    path: Path
    fd: int
    dev: int
    ino: int

    def still_ours(self) -> bool:
        """Whether the path still names the folder made (not one made again, or a link, in its place)."""
        try:
            now = os.lstat(self.path)
        except OSError:
            return False
        return stat.S_ISDIR(now.st_mode) and (now.st_dev, now.st_ino) == (self.dev, self.ino)


@dataclass
class NewDir:
    """A run dir as this process holds it: its normalised path, the folders made for it here (the
    deepest first), and the open run dir carrying this run's shared lock (None: not held)."""

    root: Path
    made: list[Made] = field(default_factory=list)
    hold: int | None = None

    def release(self) -> None:
        for fd in [*(m.fd for m in self.made), *([self.hold] if self.hold is not None else [])]:
            os.close(fd)
        self.made, self.hold = [], None


# The run dirs FreshRunDir made or found, until their job takes them. Hydra runs a single run's
# job in the process its callback ran in, so this memory is the proof of what was made: an
# environment variable could be inherited, and name a folder of the user's.
_HELD: dict[Path, NewDir] = {}


class FreshRunDir(Callback):
    @exits_on_user_error  # a run dir that cannot be made is one line and exit 2 (Hydra only warns)
    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        """Before Hydra makes the run dir (the launch dir is the cwd). Its ${now:...} is resolved
        once per config, so this is the dir Hydra uses, given back normalised."""
        root = Path(os.path.abspath(str(config.hydra.run.dir)))
        _HELD[root] = make(root, "hydra.run.dir")
        with read_write(config.hydra.run):
            config.hydra.run.dir = literal(str(root))


def taken(root: Path) -> NewDir:
    """The run dir as this process's callback made or found it (without the callback: nothing
    made, nothing held)."""
    return _HELD.pop(Path(root), None) or NewDir(Path(root))


def make(root: Path, key: str) -> NewDir:
    """Makes the run dir `root` (absolute, normalised) and the folders above it that are missing,
    and holds it. A folder another process made meanwhile is that process's; a run dir removed
    while this one waited for its lock (another run's mistake) is made again. `key` names the
    setting in messages."""
    for _ in range(ATTEMPTS):
        new = NewDir(root, _made_up_to(root, key))
        new.hold = _shared_hold(root, key)
        if new.hold is not None or not CAN_HOLD:
            return new
        new.release()
    raise UserError(f"{key}: {root} was removed each time this run made it: is another process removing it?")


def _made_up_to(root: Path, key: str) -> list[Made]:
    """The missing folders of `root` made, the highest first; those made here, the deepest first."""
    missing = []
    for folder in [root, *root.parents]:
        if os.path.lexists(folder):
            break
        missing.append(folder)
    made: list[Made] = []
    for folder in reversed(missing):
        try:
            os.mkdir(folder)
        except FileExistsError:
            continue  # another process made it meanwhile: its, not this run's (a file: see _shared_hold)
        except FileNotFoundError:
            break  # a folder above went meanwhile (another run's mistake): _shared_hold fails, make retries
        except OSError as exc:
            raise unusable(root, key, exc) from None
        if CAN_HOLD:
            made.append(_opened(folder))
    return made[::-1]


def _opened(folder: Path) -> Made:
    fd = os.open(folder, _FOLDER | getattr(os, "O_NOFOLLOW", 0))
    opened = os.fstat(fd)
    return Made(folder, fd, opened.st_dev, opened.st_ino)


def _shared_hold(root: Path, key: str) -> int | None:
    """The run dir opened with a shared lock; None when it is not there (removed meanwhile)."""
    if not CAN_HOLD:
        if not root.is_dir():
            raise unusable(root, key, NotADirectoryError())
        return None
    try:
        fd = os.open(root, _FOLDER)
    except FileNotFoundError:
        if os.path.islink(root):
            raise UserError(f"{key}: {root} is a link to nothing") from None
        return None
    except OSError as exc:
        raise unusable(root, key, exc) from None
    fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while another run removes a folder it made
    opened = os.fstat(fd)
    with contextlib.suppress(OSError):
        now = os.stat(root)
        if (now.st_dev, now.st_ino) == (opened.st_dev, opened.st_ino):
            return fd
    os.close(fd)
    return None


def unusable(root: Path, key: str, exc: OSError) -> UserError:
    """The one line for a folder that could not be made or opened: a file in its place or above it,
    or what the system said."""
    existing = next((p for p in [root, *root.parents] if os.path.lexists(p)), root)
    if isinstance(exc, (FileExistsError, NotADirectoryError)) or not existing.is_dir():
        return UserError(f"{key}: {existing} is a file, not a folder")
    return UserError(f"{key}: {root}: {exc.strerror or exc}")


@contextlib.contextmanager
def discarded_on_mistake(new: NewDir, own: set[str]) -> Iterator[None]:
    """While the run lasts: on a user mistake, the folders made for it go again (`discard`); at
    its end, however it ends, the run dir is no longer held."""
    try:
        yield
    except Exception as exc:
        if user_error_message(exc) is not None:
            discard(new, own)
        raise
    finally:
        new.release()


def discard(new: NewDir, own: set[str]) -> None:
    """Removes the folders made for the run, the run dir first, when the run dir is one this
    process made, no other run holds it, and it holds no more than the entries named in `own`. A
    folder above it goes only when it is empty and still the one made."""
    if new.hold is None or not new.made or new.made[0].path != new.root:
        return
    with contextlib.suppress(OSError):  # a folder that cannot go stays: the mistake is what the user must see
        fcntl.flock(new.hold, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: another run holds it
        if not new.made[0].still_ours() or not set(os.listdir(new.root)) <= own:
            return
        for name in os.listdir(new.root):
            entry = new.root / name
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        for folder in new.made:
            if not folder.still_ours():
                return
            os.rmdir(folder.path)  # only an empty folder: one that gained anything else stays
