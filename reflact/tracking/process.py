"""The tracker process itself (its program is reflact.tracking.worker): started, kept idle for a
sweep's next job, stopped; and the messages the run sends it (a run's context, its store, its end).

The standard library only: the command line imports this before Hydra and the rest of reflact,
so that the tracker starts importing mlflow (seconds of CPU, on another core) ~0.35 s sooner
than it could once the run's own imports are done.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import reflact

if TYPE_CHECKING:  # the messages' contents; the run that sends them has these loaded already
    from reflact.config import DataConfig, MlflowConfig, OptimizerConfig, PromptsConfig, ReflectConfig
    from reflact.inputs.dataset import Dataset
    from reflact.prompting.prompts import SystemPrompts
    from reflact.running.rundir import RunDir


@dataclass(frozen=True, kw_only=True)
class RunContext:
    """Everything about the run its MLflow run shows besides the stage's events."""

    # the sections it reads (the analysis is the run's, after the stage); `params` records them all
    data: DataConfig
    reflect: ReflectConfig
    prompts: PromptsConfig
    optimizer: OptimizerConfig
    mlflow: MlflowConfig
    params: dict[str, str]
    run_dir: RunDir
    launch_dir: Path
    started_at: float  # epoch seconds
    dataset: Dataset | None = None  # logged as the run's dataset input
    system: SystemPrompts | None = None  # registered in the prompt registry and linked
    overrides: tuple[str, ...] = ()
    sweep_dir: Path | None = None
    job: int | None = None
    template_hashes: dict[str, str] | None = None  # group -> content hash (default: of `system`)


@dataclass(frozen=True)
class Opening:
    """The first message of a run: its store, so that the process imports what writing to it
    needs and opens it (a local database's engine and schema check, a fresh one's migrations)
    while the run prepares its first requests."""

    uri: str


@dataclass(frozen=True)
class Start:
    context: RunContext
    uri: str


@dataclass(frozen=True)
class Recorded:
    """A request ended, its trace record written at `offset` of the run dir's traces.jsonl before
    this is sent: the tracker reads it from there when it traces it, so neither the pipe nor a
    tracker that falls behind holds the request's messages and reply."""

    tag: str
    number: int
    offset: int


@dataclass(frozen=True)
class End:
    summary: dict | None  # None when the run was stopped before its summary
    status: str
    digest: str  # what the run holds, for the run dir's record (reflact.tracking.live)
    deadline_s: float  # give up when the store has failed for this long
    ended_ms: int  # the run's end (epoch milliseconds): its MLflow end time, however late it is written


def spawn() -> subprocess.Popen:
    """The tracker process, importing this very reflact; a terminal's signals reach only the run
    (which ends the MLflow run through the pipe). Nothing is on its command line: a database URI
    may hold a password."""
    env = dict(os.environ)
    root = str(Path(reflact.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.Popen(
        [sys.executable, "-m", "reflact.tracking.worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        # its own process group, so a terminal's Ctrl-C reaches only the run; not its own session:
        # Linux shares CPU fairly between sessions first, so each of a sweep's trackers in a session
        # of its own took as much CPU as all of the sweep's jobs together (a 3-job joblib sweep on
        # 2 cores started its first requests ~4 s later)
        process_group=0,
    )


def write(proc: subprocess.Popen, message: object) -> None:
    """One message down the tracker's stdin, framed: the tracker reads bytes on one thread and
    unpickles them on another."""
    assert proc.stdin is not None
    frame = pickle.dumps(message)
    proc.stdin.write(len(frame).to_bytes(8, "big") + frame)
    proc.stdin.flush()


def end(proc: subprocess.Popen) -> None:
    """A tracker process stopped, whatever it was doing or waiting for. Not waited for: the kernel
    takes ~25 ms to tear down its ~250 MB, which the end of the run need not wait on (the Popen
    reaps it later; a command line that exits leaves it to init)."""
    proc.kill()


class SpareTracker:
    """A process's idle tracker process, for its next run. The command line starts one before it
    imports Hydra, so that it imports mlflow beside the run's whole start; a run whose tracker
    ended cleanly gives it back, so the next job of a sweep in this process finds mlflow imported
    and its store open. One left idle at the end (MLflow off, `--cfg`, a mistake, the last job) is
    stopped (`discard`). A launcher that pickles the job to run it in another process (joblib's
    workers, Ray's) sends no tracker: the job takes that process's own spare (`of_this_process`),
    which its next jobs there share, so a worker imports mlflow once, not once per job; one left
    idle there ends with the worker (its stdin closes)."""

    def __init__(self, process: subprocess.Popen | None = None) -> None:
        self._proc = process
        self._lock = threading.Lock()  # jobs of a threaded launcher share the process's spare

    @classmethod
    def started(cls) -> SpareTracker:
        try:
            return cls(spawn())
        except OSError:  # the run starts its own, and says why that failed
            return cls()

    def take(self) -> subprocess.Popen | None:
        with self._lock:
            proc, self._proc = self._proc, None
        return proc

    def give(self, process: subprocess.Popen) -> None:
        """Keeps `process`, idle, for the next run; with one kept already, `process` is stopped."""
        with self._lock:
            kept = self._proc is None
            if kept:
                self._proc = process
        if not kept:
            end(process)

    def discard(self) -> None:
        proc = self.take()
        if proc is not None:
            end(proc)

    def __reduce__(self):
        return (of_this_process, ())


# the spare of each process that runs jobs pickled to it, by process id: a process forked from
# one must not write to its parent's tracker
_OF_PROCESS: dict[int, SpareTracker] = {}
_LOCK = threading.Lock()


def of_this_process() -> SpareTracker:
    """The spare of the process a launcher sent a job to, one for all its jobs there."""
    with _LOCK:
        return _OF_PROCESS.setdefault(os.getpid(), SpareTracker())
