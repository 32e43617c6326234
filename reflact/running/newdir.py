"""A run dir made for a run that a mistake stops before any call is removed again.

Hydra makes the run dir (and `outputs/runs/<date>/`) before the job starts, so each mistaken
command would leave an empty folder behind. `FreshRunDir`, a Hydra callback, notes before that
which folders the run will create; the job removes them again when a user mistake ends it and the
run dir holds nothing but what this process put there (Hydra's log). A run dir that existed
before (a rerun) is never touched; nor is a folder that holds anything else.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, open_dict

# set for the job only (hydra.job.env_set): the highest folder this run's dir creates
FRESH_ENV = "REFLACT_FRESH_RUN_DIR"


def first_missing(path: Path) -> Path | None:
    """The highest folder of `path` (itself included) that does not exist yet: what making it creates."""
    missing = None
    for folder in [path, *path.parents]:
        if folder.exists():
            break
        missing = folder
    return missing


class FreshRunDir(Callback):
    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        """Before Hydra makes the run dir: which of its folders are new (the launch dir is the cwd).
        The run dir's ${now:...} is resolved once per config, so this is the dir Hydra makes."""
        made = first_missing(Path(str(config.hydra.run.dir)).absolute())
        if made is not None:
            with open_dict(config.hydra.job.env_set):
                config.hydra.job.env_set[FRESH_ENV] = str(made)


@contextlib.contextmanager
def discarded_on_mistake(root: Path, made: Path | None, own: set[str]):
    """On a user mistake, removes `root` and the folders made for it up to `made` (None: the run
    dir existed, nothing is removed) when `root` holds no more than the entries named in `own`."""
    from reflact.errors import user_error_message

    try:
        yield
    except Exception as exc:
        if made is not None and user_error_message(exc) is not None:
            discard(Path(root), made, own)
        raise


def discard(root: Path, made: Path, own: set[str]) -> None:
    with contextlib.suppress(OSError):  # a folder that cannot go stays: the mistake is what the user must see
        if root.is_dir():
            entries = os.listdir(root)
            if not set(entries) <= own:
                return
            for name in entries:
                entry = root / name
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        for folder in [root, *root.parents]:
            if folder.exists():
                folder.rmdir()  # only an empty folder: one that gained anything else stays
            if folder == made:
                return
