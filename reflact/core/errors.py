"""User mistakes: the one exception type for them, and how every command reports them (and what
else a command ends on: a failed run, Ctrl-C and SIGTERM, noted by StopSignal).

A mistake (bad config, bad input file) ends a command with one line on stderr naming the key,
file or line at fault, and exit code 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from reflact.core.imports import one_at_a_time

T = TypeVar("T")


class UserError(Exception):
    """A mistake the user can fix; the message names the key, file or line at fault."""


class RunFailed(Exception):
    """The run ended FAILED (exit code 1): the message says why and what to check."""


class JobFailed(Exception):
    """A sweep's job ended FAILED or on a mistake (its line already printed): Hydra records it as
    the job's failure, the sweep records it and runs its other jobs, then ends FAILED (exit code 1)."""


class Stopped(KeyboardInterrupt):
    """The run was stopped by Ctrl-C (exit code 130) or SIGTERM (143); the message says how to go on."""

    def __init__(self, message: str = "interrupted", exit_code: int = 130) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class StopSignal:
    """Ctrl-C (SIGINT) or SIGTERM received while a command or a reflect() call runs: its handlers note
    the signal here before they raise Stopped, and every request checks the note before it starts
    (`stopping`). The exception alone is not enough: Python raises it wherever the main thread is
    when the signal comes, and a library's bare `except:` or a finalizer running just then swallows
    it (CPython prints "Exception ignored" and goes on), and the run would go on calling. The note
    is one attribute written by the handler, with no lock taken: a handler runs between any two
    steps of the main thread, which may hold any lock just then."""

    def __init__(self) -> None:
        self.received: Stopped | None = None  # the first signal's, once one came
        self._installed: list[int] = []
        self._unraisable: Callable[[Any], object] | None = None  # the hook found, while ours is in place

    def install(self, *signums: int) -> dict[int, Any]:
        """From now on these signals note themselves and raise Stopped (SIGINT: 130, SIGTERM: 143);
        returns the handlers they had. Only the main thread can; a signal ignored (a background
        job's SIGINT) stays ignored."""
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {signum: signal.getsignal(signum) for signum in signums}
        for signum, handler in previous.items():
            if handler is not signal.SIG_IGN:
                signal.signal(signum, self._stop)
                self._installed.append(signum)
        if self._unraisable is None:
            self._unraisable, sys.unraisablehook = sys.unraisablehook, self._swallowed
        return previous

    def _swallowed(self, unraisable: Any) -> None:
        """Python's report of an exception it could not raise (a finalizer's, a generator's close):
        a Stopped there is noted already and stops the run; it is not the user's to read."""
        if not isinstance(unraisable.exc_value, Stopped) and self._unraisable is not None:
            self._unraisable(unraisable)

    def ended(self) -> None:
        """The command is over, its records written: from now on its signals end the process at once
        (the system's default) rather than raise into the interpreter's teardown, where Python
        prints "Exception ignored in atexit callback" and goes on."""
        for signum in self._installed:
            signal.signal(signum, signal.SIG_DFL)

    @contextlib.contextmanager
    def handling(self, *signums: int) -> Iterator[StopSignal]:
        """`install` while the block runs; the handlers found are put back after it."""
        previous = self.install(*signums)
        try:
            yield self
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
            self._installed = [signum for signum in self._installed if signum not in previous]
            if self._unraisable is not None:
                sys.unraisablehook = self._unraisable
                self._unraisable = None

    def _stop(self, signum: int, frame: object) -> None:
        stopped = Stopped("terminated", exit_code=143) if signum == signal.SIGTERM else Stopped()
        if self.received is None:
            self.received = stopped
        raise stopped

    def check(self) -> None:
        """Raises Stopped when a signal came, whether or not its own exception got through."""
        if self.received is not None:
            raise Stopped(str(self.received), self.received.exit_code)

    def stop_of(self, exc: BaseException) -> Stopped | None:
        """The stop `exc` ends a run with, or None (a bug, a mistake): Ctrl-C as Python raises it, our
        Stopped, or any exception once a signal was noted: the signal's exception, raised in the
        middle of a library's change, can leave it to fail on its own half-made state (OmegaConf:
        an AttributeError) and that failure is what comes out."""
        if isinstance(exc, Stopped):
            return exc
        if self.received is not None:
            return self.received
        return Stopped() if isinstance(exc, KeyboardInterrupt) else None

    def stopping(self) -> threading.Event:
        """A stage's stop: set by the stage itself, and set from the moment a signal is noted."""
        return _Stopping(self)

    def __getstate__(self) -> dict:
        """A copy a launcher pickles to run a job in another process (joblib, submitit, Ray) starts
        afresh there: the signals are the launching process's to handle."""
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()  # type: ignore[misc]


class _Stopping(threading.Event):
    """An event that also reads as set once its signal is noted: is_set takes no lock (wait() does
    not see the note; nothing waits on a stage's stop, requests poll it)."""

    def __init__(self, signals: StopSignal) -> None:
        super().__init__()
        self.signals = signals

    def is_set(self) -> bool:
        return self.signals.received is not None or super().is_set()


def user_error_message(exc: BaseException) -> str | None:
    """One line for a user mistake (ours, or Hydra's and OmegaConf's about the config); None for a bug."""
    with one_at_a_time():
        from hydra.errors import HydraException
        from omegaconf.errors import OmegaConfBaseException

    if isinstance(exc, UserError):
        return " ".join(str(exc).splitlines())
    cause = exc.__cause__ if isinstance(exc.__cause__, OmegaConfBaseException) else None
    if isinstance(exc, OmegaConfBaseException):
        cause = exc
    if cause is not None:
        key = getattr(cause, "full_key", None)
        first = str(getattr(cause, "msg", None) or cause).strip().splitlines()[0]
        return f"config: {key}: {first}" if key else f"config: {first}"
    if isinstance(exc, HydraException):
        text = str(exc).split("Config search path")[0]  # the search path only repeats our own folders
        return "config: " + " ".join(line.strip() for line in text.splitlines() if line.strip()) + _plugin_hint(text)
    return None


# Hydra plugins reflact's presets use, and the extra that installs each
PLUGIN_EXTRAS = {
    "hydra/sweeper/optuna": "optuna",
    "hydra/launcher/joblib": "parallel",
    "hydra/launcher/submitit": "slurm",
    "hydra/launcher/ray": "ray",
}


def _plugin_hint(text: str) -> str:
    extra = next((extra for option, extra in PLUGIN_EXTRAS.items() if option in text), None)
    return f" (install it with: pip install 'reflact[{extra}]')" if extra else ""


WARNINGS_LOGGER = "py.warnings"  # where logging.captureWarnings sends them
SHOWN = "reflact-shown-warnings"  # the handler of the warnings that stay on stderr
OWN_LINES = "reflact-own-lines"  # a tool's console handler (own_lines_shown)


class HeldWarnings(logging.Handler):
    """Keeps the library warnings of a command's start (Hydra composing, before a run has a log
    file) for the log file a run opens later (warnings_to_run_log)."""

    LIMIT = 200  # a library warning in a loop must not grow the process

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.records) < self.LIMIT:
            self.records.append(record)


def warnings_to_log() -> None:
    """Library warnings (Hydra's, OmegaConf's, MLflow's deprecations) go to the log, never to the
    console: there they would come before the one line a command ends with. Hydra's warning that
    a callback raised stays on stderr: it reports a bug of reflact's."""
    logging.captureWarnings(True)
    logger = logging.getLogger(WARNINGS_LOGGER)
    logger.propagate = False
    if not any(h.name == SHOWN for h in logger.handlers):  # once a process
        logger.addHandler(HeldWarnings())
        shown = logging.StreamHandler()
        shown.set_name(SHOWN)
        shown.addFilter(lambda record: "Callback " in record.getMessage() and " raised " in record.getMessage())
        logger.addHandler(shown)


def warnings_held() -> None:
    """At a job's start: library warnings are held again (not written to an earlier job's log
    file), until the run's inputs passed their checks (warnings_to_run_log)."""
    logger = logging.getLogger(WARNINGS_LOGGER)
    logger.handlers = [h for h in logger.handlers if not isinstance(h, logging.FileHandler)]
    if not any(isinstance(h, HeldWarnings) for h in logger.handlers):
        logger.addHandler(HeldWarnings())


def warnings_to_run_log() -> None:
    """Once the run's inputs passed their checks (a mistaken rerun leaves an existing log as it
    was): the warnings held so far are written to its log file (Hydra's job logging), and later
    ones go to it too."""
    logger = logging.getLogger(WARNINGS_LOGGER)
    files: list[logging.Handler] = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    held = [h for h in logger.handlers if isinstance(h, HeldWarnings)]
    shown = [h for h in logger.handlers if not isinstance(h, (logging.FileHandler, HeldWarnings))]
    logger.handlers = shown + files  # a sweep's next job in this process has a log file of its own
    for record in (record for h in held for record in h.records):
        for handler in files:
            handler.handle(record)


class _Stderr(logging.StreamHandler):
    """Writes to sys.stderr as it is when a line is written (the stream a caller swapped in, too)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def own_lines_shown() -> None:
    """A tool's console (analyze, relog): reflact's own lines, INFO and up, on stderr, as `message`;
    no other logger's (the HTTP client's line per request, MLflow's notes on its store)."""
    root = logging.getLogger()
    if not any(h.name == OWN_LINES for h in root.handlers):  # once a process (tests call main again)
        shown = _Stderr()
        shown.set_name(OWN_LINES)
        shown.setFormatter(logging.Formatter("%(message)s"))
        shown.addFilter(lambda record: record.name == "reflact" or record.name.startswith("reflact."))
        root.addHandler(shown)
    logging.getLogger("reflact").setLevel(logging.INFO)


def exits_on_user_error(command: Callable[..., T]) -> Callable[..., T]:
    """Wraps a command: a user mistake becomes one line on stderr and exit code 2; a failed run
    one line and exit code 1; Ctrl-C or SIGTERM one line and 130 or 143. No traceback for any.
    Library warnings go to the log (warnings_to_log), not between the user and that line."""

    @functools.wraps(command)
    def guarded(*args, **kwargs) -> T:
        warnings_to_log()
        try:
            return command(*args, **kwargs)
        except KeyboardInterrupt as exc:
            print(f"reflact: {exc if isinstance(exc, Stopped) else 'interrupted'}", file=sys.stderr)
            raise SystemExit(getattr(exc, "exit_code", 130)) from None
        except Exception as exc:  # mistakes get one line; bugs keep their traceback
            line, code = _ending(exc)
            print(f"reflact: {line}", file=sys.stderr)
            raise SystemExit(code) from None

    return guarded


def fails_the_job(command: Callable[..., T]) -> Callable[..., T]:
    """Wraps a sweep's job: a failed run or a mistake prints its one line and raises JobFailed
    instead of exiting, so Hydra records the job as failed and the launcher runs the next one
    (an exit would end the whole sweep). Ctrl-C and SIGTERM are left to exits_on_user_error."""

    @functools.wraps(command)
    def guarded(*args, **kwargs) -> T:
        try:
            return command(*args, **kwargs)
        except Exception as exc:  # bugs keep their traceback
            line, _ = _ending(exc)
            print(f"reflact: {line}", file=sys.stderr)
            raise JobFailed(line) from None

    return guarded


def _ending(exc: Exception) -> tuple[str, int]:
    """(the one line, the exit code) of a failed run or a user mistake; a bug is raised again."""
    if isinstance(exc, RunFailed):
        return f"run failed: {exc}", 1
    message = user_error_message(exc)
    if message is None:
        raise exc
    return f"error: {message}", 2
