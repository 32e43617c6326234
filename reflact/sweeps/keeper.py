"""The sweep's parent run kept beside its jobs: a process forked from the launching one opens the
parent run (importing mlflow and opening the store: seconds of CPU) while the jobs start, and ends
it when the multirun ends. Without it the first job waited for all of that.

The jobs read the parent's run id from the sweep dir when their tracker creates their run; while
the keeper opens it they wait for it there (reflact.tracking.nesting.PARENT_WAIT_S), which
holds back no request. The keeper is in the launching process's session but a process group of its
own, so a terminal's Ctrl-C reaches only the launching process, which then tells it to end the
parent. Should the launching process die, the keeper ends the parent as an aborted sweep.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import NoReturn

from reflact.core.text import one_line
from reflact.running.rundir import SweepDir

log = logging.getLogger("reflact")


def can_fork() -> bool:
    return hasattr(os, "fork")


def keep(sweep: SweepDir, open_parent: Callable[[], None], end_parent: Callable[[bool], str]) -> Keeper:
    """The keeper of `sweep`'s parent run, opening it now: its record set aside meanwhile, so that
    the jobs wait for the new one rather than read the last sweep's."""
    sweep.set_parent_aside()

    def opening() -> None:
        try:
            open_parent()
        finally:
            sweep.parent_settled()

    return Keeper.fork(opening, end_parent)


class Keeper:
    """The launching process's end of the keeper: tell it the multirun's end, get what MLflow lacks."""

    def __init__(self, pid: int, down: int, up: int) -> None:
        self._pid, self._down, self._up = pid, down, up

    @classmethod
    def fork(cls, open_parent: Callable[[], None], end_parent: Callable[[bool], str]) -> Keeper:
        """A keeper that calls `open_parent()` at once and `end_parent(failed)` when told (or when
        the launching process is gone). Forked before the launcher starts a job or a thread."""
        down_r, down_w = os.pipe()
        up_r, up_w = os.pipe()
        sys.stdout.flush()  # else what is buffered would be printed twice
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.close(down_w)
            os.close(up_r)
            _keep(open_parent, end_parent, down_r, up_w)
        os.close(down_r)
        os.close(up_w)
        return cls(pid, down_w, up_r)

    def end(self, failed: bool) -> str | None:
        """Ends the parent run (FAILED, KILLED or FINISHED from its job dirs) and returns what MLflow
        lacks of the sweep, with the command that writes it ("" when nothing); None when the keeper
        died without saying."""
        try:
            os.write(self._down, b"1" if failed else b"0")
        except OSError:  # the keeper is gone
            pass
        os.close(self._down)
        with os.fdopen(self._up, "rb") as answer:
            said = answer.read()
        os.waitpid(self._pid, 0)
        return json.loads(said) if said else None


def _keep(open_parent: Callable[[], None], end_parent: Callable[[bool], str], down: int, up: int) -> NoReturn:
    code = 1
    try:
        os.setpgid(0, 0)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launching process handles Ctrl-C
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the launching process's handlers are not ours
        signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # a line to the terminal must not stop it
        try:
            open_parent()
        except Exception as exc:  # as Hydra does with a callback's failure: one warning, the jobs run
            log.warning("the sweep's MLflow parent run could not be opened: %s", one_line(exc))
        told = os.read(down, 1)  # nothing: the launching process died, the sweep is over
        os.write(up, json.dumps(end_parent(told != b"0")).encode("utf-8"))
        code = 0
    except BaseException as exc:  # noqa: BLE001  # the launching process says the parent is relog's
        log.warning("the sweep's MLflow parent run could not be ended: %s", one_line(exc))
    finally:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # none of the launching process's exit handlers: they are its own
