"""MLflow as a live view of the run dir: an observer of the stage's events.

The stage's threads only put events on a queue; one tracker thread opens the store (importing
mlflow and migrating a fresh store take seconds: they overlap the first calls), creates the run
(RUNNING, with the run's real start time) and writes each minibatch's metrics, artifacts and
traces as they come, in batches, with the run's totals so far. No call ever waits on it, and a
tracking failure only costs a warning: the run dir stays complete (`python -m reflact.relog`).

The thread starts with the first request. A rerun that makes none and finds its MLflow run
already holding the same patches under the same settings leaves that run as it is.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Literal

from reflact.imports import one_at_a_time
from reflact.running.events import CallStarted, MinibatchEnded, Replied
from reflact.tracking.mirror import Mirror, RunContext
from reflact.tracking.store import Store, mlflow_globals_at, one_line, tracking_uri

log = logging.getLogger("reflact")
SAVED: dict = {}  # stands for a saved patch in the queue
# importing mlflow is seconds of CPU: let the first requests go out before the tracker starts it
FIRST_REQUESTS_S = 0.2
BATCH_S = 0.5  # events written together: one metrics request per batch, not per minibatch


@dataclass(frozen=True)
class _End:
    summary: dict | None  # None when the run was stopped before its summary
    status: str


class LiveRun:
    """The observer. `finish` ends the MLflow run and returns its id (None when nothing was logged)."""

    def __init__(self, context: RunContext) -> None:
        self.context = context
        self.uri = tracking_uri(context.cfg, context.launch_dir)
        self.run_id: str | None = None
        self.finished = False
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._patches: dict[str, str] = {}  # tag -> the patch's fingerprint, or the minibatch's status
        self._mirror: Mirror | None = None  # set before its run is created: a failed open still ends it

    def __call__(self, event) -> None:
        if isinstance(event, MinibatchEnded):
            patch = event.patch or {}
            self._patches[event.outcome.tag] = str(patch.get("fingerprint") or event.outcome.status)
            # the queue holds what the tracker needs, not the patch itself (it is on disk)
            event = MinibatchEnded(event.outcome, SAVED if event.patch is not None else None)
        elif isinstance(event, Replied) and not self.context.cfg.mlflow.trace_calls:
            return  # its messages are only needed for a trace
        self._queue.put(event)
        if isinstance(event, CallStarted) and self._thread is None:
            self._start(FIRST_REQUESTS_S)

    def finish(self, summary: dict | None, status: str) -> str | None:
        """Logs what is left, ends the run with `status` and its real end time."""
        self.finished = True
        record = self.context.run_dir.mlflow_record()
        if self._thread is None and status == "FINISHED" and self._up_to_date(record):
            log.info("MLflow run %s already holds this run's patches; left as it is", record["run_id"])
            return record["run_id"]
        self._start(0.0)
        self._queue.put(_End(summary, status))
        assert self._thread is not None  # _start made it
        self._thread.join()
        return self.run_id

    def digest(self) -> str:
        """What the MLflow run holds: the settings and each minibatch's patch (or status)."""
        shape = {"params": self.context.params, "patches": self._patches}
        return hashlib.sha256(json.dumps(shape, sort_keys=True).encode("utf-8")).hexdigest()

    def _up_to_date(self, record: dict) -> bool:
        return (
            record.get("tracking_uri") == self.uri
            and record.get("status") == "FINISHED"
            and record.get("digest") == self.digest()
        )

    def _start(self, delay_s: float) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, args=(delay_s,), name="reflact-mlflow", daemon=True)
                self._thread.start()

    def _work(self, delay_s: float) -> None:
        """The tracker thread: open the run, then write what the events say until the end."""
        writer = None
        time.sleep(delay_s)
        with mlflow_globals_at(self.uri):
            while True:
                events = _drain(self._queue)
                end = next((e for e in events if isinstance(e, _End)), None)
                with one_at_a_time():  # MLflow loads parts of itself as it first uses them
                    writer = self._write(writer, [e for e in events if not isinstance(e, _End)])
                    if end is not None:
                        self._end(writer, end)
                        return

    def _write(self, writer: Mirror | Literal[False] | None, events: list) -> Mirror | Literal[False]:
        """Writes a batch of events; after a failure, events are dropped (the run dir has them)."""
        if writer is False:
            return writer
        try:
            if writer is None:
                writer = self._open()
            writer.write(events)
            return writer
        except Exception as exc:  # tracking must never cost the run
            self._warn(exc)
            return False

    def _open(self) -> Mirror:
        c = self.context
        store = Store(self.uri, c.cfg.mlflow.experiment, c.launch_dir)
        writer = self._mirror = Mirror(store, c)
        self.run_id = writer.open()
        c.run_dir.write_mlflow_record({"run_id": self.run_id, "tracking_uri": self.uri, "status": "RUNNING"})
        return writer

    def _end(self, writer: Mirror | Literal[False] | None, end: _End) -> None:
        if writer is False:  # the run, if created, still gets its true end when the store allows it
            if self._mirror is not None and self._mirror.store.run_id:
                with contextlib.suppress(Exception):
                    self._mirror.store.end(end.status, int(time.time() * 1000))
            return
        try:
            writer = writer or self._open()
            writer.end(end.summary, end.status)
            self.context.run_dir.write_mlflow_record(
                {"run_id": self.run_id, "tracking_uri": self.uri, "status": end.status, "digest": self.digest()}
            )
        except Exception as exc:  # tracking must never cost the run
            self._warn(exc)

    def _warn(self, exc: BaseException) -> None:
        run_dir = self.context.run_dir.root
        log.warning(
            "MLflow logging to %s failed (%s); the run goes on and its outputs are complete in %s. Log "
            "them later with: python -m reflact.relog %s",
            self.uri,
            one_line(exc),
            run_dir,
            run_dir,
        )


def _drain(events: queue.SimpleQueue) -> list:
    """What is queued: at least one event (waiting for it), then what else comes within BATCH_S."""
    batch = [events.get()]
    deadline = time.monotonic() + BATCH_S
    while time.monotonic() < deadline and not isinstance(batch[-1], _End):
        try:
            batch.append(events.get(timeout=max(deadline - time.monotonic(), 0)))
        except queue.Empty:
            break
    return batch
