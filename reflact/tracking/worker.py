"""The tracker process: `python -m reflact.tracking.worker`, started by reflact.tracking.process.

It reads pickled messages on stdin (the run's store first, then the run's context, then the
stage's events, then the end) and answers JSON lines on stdout (the run's id, log lines, and
when it is done); a run that ended cleanly leaves it waiting for the launching process's next
run (a sweep's next job). Being a process of its own, a tracking server that hangs can hold
nothing of the run: the run waits for it at most `mlflow.deadline_s` at its end, then stops
it. MLflow's CPU work runs beside the stage for real, not on a thread that shares its
interpreter. The command line starts it before it imports Hydra (reflact.tracking.process), so
that importing mlflow (seconds) overlaps the run's own start; it is told the store once that is
known, and opens a local one while the run prepares its first requests.

A write that fails is retried with backoff while the run goes on; the events stay queued, so
once the store answers again the MLflow run catches up (metrics, files, every trace) and ends
with its true status. When its deadline passes first, `python -m reflact.relog` logs the run
from its run dir.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import queue
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO
from urllib.parse import urlsplit

from reflact.core.errors import UserError
from reflact.core.imports import one_at_a_time
from reflact.core.text import one_line
from reflact.running.events import MinibatchEnded, Planned, Replied
from reflact.running.rundir import TraceRecords, recorded_requests
from reflact.tracking.mirror import Batch, Mirror
from reflact.tracking.process import End, Opening, Recorded, RunContext, Start
from reflact.tracking.sqlite import first_use, sqlite_path
from reflact.tracking.store import Store, mlflow_defaults, mlflow_globals_at, traced_requests

log = logging.getLogger("reflact")
# events written together: one metrics request per batch, not per minibatch; short, so that the
# last replies' traces are written while the run writes its summary
BATCH_S = 0.1
# the stage's last metrics and files wait at most this long for the run's end (its summary and
# analysis), to be written with the end's own in one write; its last traces are written at once
HOLD_S = 0.5
FIRST_RETRY_S = 0.5  # then doubling, up to LAST_RETRY_S, while the store does not answer
LAST_RETRY_S = 8.0
PROBE_S = 2.0  # the first look at an HTTP tracking server
SQL_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")  # the stores MLflow keeps with SQLAlchemy
ORPHAN_S = 10.0  # a tracker whose run was killed ends its MLflow run KILLED within this


@dataclass
class Backoff:
    wait_s: float = FIRST_RETRY_S
    next_at: float = 0.0  # monotonic
    failing: str = ""  # the last failure, in one line; empty while the store answers
    answered_at: float = field(default_factory=time.monotonic)  # the store's last answer

    def failed(self, exc: BaseException, send: Callable[[dict], None]) -> None:
        send({"failing": True})  # the parent's deadline counts from now on, not from mlflow's import
        if not self.failing:
            log.info("MLflow did not answer (%s); retrying while the run goes on", one_line(exc))
        self.failing = one_line(exc)
        self.next_at = time.monotonic() + self.wait_s
        self.wait_s = min(self.wait_s * 2, LAST_RETRY_S)

    def answered(self) -> None:
        if self.failing:
            log.info("MLflow answers again; the run caught up")
        self.wait_s, self.next_at, self.failing = FIRST_RETRY_S, 0.0, ""
        self.answered_at = time.monotonic()


@dataclass
class Tracker:
    """The MLflow run of one run dir, written from queued events, retried until the deadline."""

    context: RunContext
    uri: str
    send: Callable[[dict], None]  # one message to the parent
    mirror: Mirror | None = None
    pending: list = field(default_factory=list)  # events not written yet (traces excepted)
    unwritten: Batch = field(default_factory=Batch)  # the pending events' metrics and files, once counted
    # the requests not traced yet, each where its record is in the run dir's traces.jsonl: their
    # messages are read from there when traced, so a tracker behind the run holds none of them
    recorded: list[Recorded] = field(default_factory=list)
    traced: set = field(default_factory=set)  # (tag, number) sent as traces
    reused: set = field(default_factory=set)  # reused minibatches whose recorded requests are still to trace
    records: TraceRecords | None = None  # the run dir's trace records
    backoff: Backoff = field(default_factory=Backoff)
    planned: int | None = None  # the plan's minibatches, once known
    settled: int = 0
    over_at: float | None = None  # monotonic: when the last planned minibatch settled

    def add(self, event) -> None:
        if isinstance(event, Recorded):
            self.recorded.append(event)
            return
        self.pending.append(event)
        if isinstance(event, Planned):
            self.planned = len(event.plan)
        elif isinstance(event, MinibatchEnded):
            self.settled += 1
            if event.outcome.status == "reused":  # its requests were made by an earlier run of the dir
                self.reused.add(event.outcome.tag)
        if self.over_at is None and self.planned is not None and self.settled >= self.planned:
            self.over_at = time.monotonic()

    def holds(self) -> bool:
        """Whether the stage's last metrics and files still wait for the run's end."""
        return self.over_at is not None and time.monotonic() < self.over_at + HOLD_S

    def wake_in(self) -> float | None:
        """How long to wait for the next event before writing what the stage left (its held end,
        then each retry); None: nothing is left to write, wait for the next event."""
        if self.over_at is None or not (self.pending or self.unwritten):
            return None
        now = time.monotonic()
        return max(self.over_at + HOLD_S, self.backoff.next_at, now) - now

    def flush(self, rest: bool = True) -> None:
        """Writes what is queued (opening the run first): the traces, and unless `rest` is false the
        metrics and files; raises when the store fails."""
        if self.mirror is None:
            store = Store(self.uri, self.context.mlflow.experiment, self.context.launch_dir)
            self.send({"answered": True})
            store.client = Answering(store.client, self.send)  # type: ignore[assignment]  # the same methods
            mirror = Mirror(store, self.context)
            run_id = mirror.open()
            self.context.run_dir.write_mlflow_record({"run_id": run_id, "tracking_uri": self.uri, "status": "RUNNING"})
            self.send({"run_id": run_id})
            self.mirror = mirror
        if self.context.mlflow.trace_calls:
            new = self._untraced()
            self.mirror.store.traces(new, self.context.optimizer.model)
            self.traced.update((event.tag, event.number) for event in new)
            self.recorded, self.reused = [], set()
        if self.pending:
            self.unwritten.extend(self.mirror.batch(self.pending))
            self.pending = []
        if rest and self.unwritten:
            self.mirror.log(self.unwritten)
            self.unwritten = Batch()

    def _untraced(self) -> list[Replied]:
        """The requests to trace, read from the run dir's trace records: the new ones, and those that
        made the reused minibatches' patches (the MLflow run this one replaces held their traces,
        and relog would write them too)."""
        self.records = self.records or TraceRecords(self.context.run_dir)
        fresh = [r for r in self.recorded if (r.tag, r.number) not in self.traced]
        records = self.records.at([r.offset for r in fresh])
        if self.reused:
            records += self.records.of(self.reused)
        events = recorded_requests(records, self.records.path)
        return [event for event in events if (event.tag, event.number) not in self.traced]

    def attempt(self) -> bool:
        """One try at writing what is queued, when the backoff allows; whether it all went."""
        if time.monotonic() < self.backoff.next_at:
            return False
        try:
            self.flush(rest=not self.holds())
        except Exception as exc:  # the store is down, frozen or refusing: try again later
            self.backoff.failed(exc, self.send)
            return False
        self.backoff.answered()
        return True

    def end(self, end: End) -> str:
        """Catches up, checks every trace reached the store when MLflow's tracer wrote them (it
        only logs a failed export), ends the run; retried until the store has failed for the
        deadline, then the run's status alone (`_abandon`). An empty answer when it ended, else
        the last failure."""
        self.backoff.answered_at = time.monotonic()  # the store gets the deadline from the run's end on
        while True:
            try:
                self.flush(rest=False)  # the rest goes with the end's own metrics and files
                assert self.mirror is not None  # flush opened it
                if self.mirror.store.tracer_used:  # a write of our own raises when it fails
                    self._resend_lost_traces()
                self.mirror.end(end.summary, end.status, end.ended_ms, last=self.unwritten)
                record = {"run_id": self.mirror.store.run_id, "tracking_uri": self.uri, "status": end.status}
                self.context.run_dir.write_mlflow_record({**record, "digest": end.digest})
                return ""
            except UserError as exc:  # a store no retry opens (half-migrated): said at once
                self.backoff.failed(exc, self.send)
                return self.backoff.failing
            except Exception as exc:  # retried until the deadline
                self.backoff.failed(exc, self.send)
            pause = max(self.backoff.next_at - time.monotonic(), 0.0)
            if time.monotonic() + pause >= self.backoff.answered_at + end.deadline_s:
                self._abandon(end)
                return self.backoff.failing
            time.sleep(pause)

    def _abandon(self, end: End) -> None:
        """The run's status, and what it lacks, when the rest of its end cannot be written (an
        artifact store refusing files, say): never left RUNNING while the store answers."""
        if self.mirror is None:
            return
        try:
            self.mirror.abandon(end.status, end.ended_ms, self.backoff.failing)
        except Exception:  # noqa: BLE001  # the store fails altogether: relog's, as the warning says
            return

    def _resend_lost_traces(self) -> None:
        assert self.mirror is not None
        present = traced_requests(self.mirror.store)
        lost = {(tag, number) for tag, number in self.traced if (tag, str(number)) not in present}
        if not lost:
            return
        records = TraceRecords(self.context.run_dir)  # read afresh: every request of the run is there now
        recorded = recorded_requests(records.of({tag for tag, _ in lost}), records.path)
        self.mirror.store.traces([e for e in recorded if (e.tag, e.number) in lost], self.context.optimizer.model)


# the client's calls that return although their write failed: MLflow's tracer exports the trace
# and only logs a failure (reflact checks these traces at the end: Tracker._resend_lost_traces)
UNCHECKED = ("start_trace", "end_trace")


class Answering:
    """The store's client, telling the parent each time the store answered: whether the store is
    failing decides how long the run's end waits for it (reflact.tracking.live)."""

    def __init__(self, client, send: Callable[[dict], None]) -> None:
        self._client, self._send = client, send

    def __getattr__(self, name: str):
        attribute = getattr(self._client, name)
        if not callable(attribute) or name in UNCHECKED:
            return attribute

        def answered(*args, **kwargs):
            result = attribute(*args, **kwargs)
            self._send({"answered": True})
            return result

        return answered


def serve(inbox: queue.SimpleQueue, send) -> None:
    """The tracker's loop: batches of events written as they come, retried while the store fails.
    This thread alone imports (holding the lock throughout); the inbox thread only reads bytes."""
    with one_at_a_time():
        _serve(_Messages(inbox), send)


class _Messages:
    """The inbox's frames as messages, unpickled on the thread that reads them; the end of stdin
    (the run killed before its end) is an end KILLED."""

    def __init__(self, frames: queue.SimpleQueue) -> None:
        self.frames = frames

    def get(self, timeout: float | None = None):
        frame = self.frames.get(timeout=timeout)
        if frame:
            return pickle.loads(frame)
        self.frames.put(frame)  # stdin stays ended: an idle tracker then ends too
        return End(None, "KILLED", "", ORPHAN_S, int(time.time() * 1000))


def _serve(inbox: _Messages, send) -> None:
    """Runs one after another: a process whose run ended cleanly waits for the next run of the
    same launching process (the next job of a sweep), mlflow imported and the store open."""
    _warm()
    while True:
        message = inbox.get()
        if isinstance(message, Opening):
            _open(message.uri, send)
        elif isinstance(message, Start):
            _track(message, inbox, send)
        else:  # an end before any run was known, or stdin closed: the launching process is done
            return


def _track(start: Start, inbox: _Messages, send) -> None:
    """One run, from its start to the answer that it is done."""
    tracker = Tracker(start.context, start.uri, send)
    send({"ready": True})  # mlflow is imported (_warm): from now on only the store can be slow
    if not _answers(start.uri):
        send({"failing": True})
    with mlflow_globals_at(start.uri):
        tracker.backoff.answered_at = time.monotonic()
        _follow(tracker, inbox, send)


def _follow(tracker: Tracker, inbox: _Messages, send) -> None:
    """The run's events written as they come, until its end is written (or given up)."""
    while True:
        end = _gather(inbox, tracker)
        if end is not None:
            send({"done": tracker.end(end)})
            return
        tracker.attempt()


def _warm() -> None:
    """MLflow's client (seconds of CPU), which every store needs, imported while the run has yet
    to compose its config and before its first event: only the store's own work is left for the
    run's calls to overlap."""
    mlflow_defaults()
    with one_at_a_time():
        import mlflow.tracking  # noqa: F401


def _open(uri: str, send) -> None:
    """What writing to the store needs, ahead of the run's first write: SQLAlchemy's store for a
    database; a local sqlite file is also opened (its engine and schema check), a fresh one
    migrated aside first while the run is told so (reflact.tracking.sqlite: the run's end does
    not stop a tracker that migrates), and MLflow keeps it open for the next client of the same
    URI. A server is not asked here: one that hangs gets the run's deadline, which counts from
    the run's start message on. A failure is left to the first write, which retries it and
    reports it."""
    if urlsplit(uri).scheme.split("+", 1)[0] not in SQL_SCHEMES:
        return
    with one_at_a_time():
        import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
        from mlflow.tracking import MlflowClient
    if sqlite_path(uri) is None:
        return
    try:
        with first_use(uri, lambda migrating: send({"migrating": migrating})):
            MlflowClient(tracking_uri=uri, registry_uri=uri).search_experiments(max_results=1)
    except Exception:  # noqa: BLE001  # the run's own writes meet it again, with retries
        return


def _answers(uri: str) -> bool:
    """Whether a tracking server answers at all (any HTTP status), asked before mlflow is imported
    (seconds), so that a run ending early gives a dead server its deadline, not mlflow's import."""
    if not uri.startswith(("http://", "https://")):
        return True  # a local store: nothing to wait for
    try:
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=PROBE_S).close()
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):  # refused, reset, timed out, not a URL
        return False
    return True


def _gather(inbox: _Messages, tracker: Tracker) -> End | None:
    """The next events into the tracker: at least one (waiting for it, or until what the stage left
    has waited long enough for the run's end), then what else comes within the batch's window. Stops
    at the stage's last minibatch, whose traces are written at once, and at the run's end (returned)."""
    try:
        message = inbox.get(timeout=tracker.wake_in())
    except queue.Empty:
        return None
    window_s = tracker.backoff.wait_s if tracker.backoff.failing else BATCH_S
    deadline = time.monotonic() + window_s
    while not isinstance(message, End):
        over = tracker.over_at is not None
        tracker.add(message)
        if tracker.over_at is not None and not over:
            return None
        try:
            message = inbox.get(timeout=max(deadline - time.monotonic(), 0))
        except queue.Empty:
            return None
    return message


def _read(stream: IO[bytes], inbox: queue.SimpleQueue) -> None:
    """stdin's frames (an 8-byte length, then a pickle) into the inbox, as bytes; an empty frame
    when stdin ends."""
    try:
        while len(head := stream.read(8)) == 8:
            frame = stream.read(int.from_bytes(head, "big"))
            inbox.put(frame)
    except OSError:
        pass
    inbox.put(b"")


class _ToParent(logging.Handler):
    def __init__(self, send) -> None:
        super().__init__(logging.INFO)
        self.send = send

    def emit(self, record: logging.LogRecord) -> None:
        self.send({"log": [record.levelno, record.getMessage()]})


def main() -> int:
    # the parent ends this process (a terminal's Ctrl-C is the parent's to handle)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # not the terminal's foreground group: a line to stderr must not stop it (`stty tostop`)
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    # one try per request, bounded: the backoff here retries, and the run's deadline bounds it all
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    # a failed trace export is retried here: MLflow's own warning about it is not the run's news
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "ERROR")
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # anything else printing goes to stderr, never into the messages
    lock = threading.Lock()

    def send(message: dict) -> None:
        with lock:
            out.write(json.dumps(message) + "\n")
            out.flush()

    log.addHandler(_ToParent(send))
    log.setLevel(logging.INFO)
    log.propagate = False
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=_read, args=(sys.stdin.buffer, inbox), name="reflact-inbox", daemon=True).start()
    serve(inbox, send)
    return 0


if __name__ == "__main__":
    # the messages' classes are this module's, not __main__'s: run it as itself
    from reflact.tracking import worker

    code = worker.main()
    # every write is committed and the parent has its answer: the interpreter's teardown of
    # mlflow's modules (~0.5 s, which the run's end would wait for) has nothing left to do
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
