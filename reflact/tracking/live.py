"""MLflow as a live view of the run dir: an observer of the stage's events.

The stage's threads only put events on a queue; a feeder thread pickles them down a pipe to the
tracker process (reflact.tracking.worker), which opens the store (importing mlflow and migrating
a fresh store take seconds: they overlap the first calls), creates the run (RUNNING, with the
run's real start time) and writes each minibatch's metrics, artifacts and traces as they come.
No call ever waits on it. At the end the run waits for it at most `mlflow.deadline_s`; a store
that is down, frozen or never answers then costs one warning, and the run dir (which holds
every request's trace record too) is logged later by `python -m reflact.relog`.

The process starts with the run (the command line starts it even before it imports Hydra:
reflact.tracking.process) and imports mlflow beside the run's own start; it hears of the run
with the first request. A rerun that makes none and finds its MLflow run already holding the
same patches under the same settings leaves that run as it is (the process is stopped).
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import subprocess
import threading
import time

from reflact.running.events import BatchNoted, CallStarted, MinibatchEnded, Replied
from reflact.running.rundir import append_trace, trace_record
from reflact.tracking import process
from reflact.tracking.process import End, Opening, Recorded, RunContext, SpareTracker, Start
from reflact.tracking.store import now_ms, tracking_uri

log = logging.getLogger("reflact")
SAVED: dict = {}  # stands for a saved patch in the queue
# pickling the run's context (its dataset) is the run's CPU: let the first requests go out first
FIRST_REQUESTS_S = 0.2
# the part of the deadline left to the tracker's own answer (why it gave up) before it is stopped
ANSWER_S = 0.5
# how long the tracker may take to import mlflow (no store is involved yet; a busy machine is slow)
START_S = 60.0
# how often the end's wait looks again: each answer of the tracker's moves its deadline
POLL_S = 0.05
# a local sqlite store that is silent without failing is busy, not down (a sweep's other jobs
# migrating or writing it kept one silent for over 10 s on a loaded machine): it gets this long
LOCAL_STORE_S = 120.0


class LiveRun:
    """The observer. `finish` ends the MLflow run and returns its id (None when nothing was logged)."""

    def __init__(self, context: RunContext, spare: SpareTracker | None = None) -> None:
        """`spare`: this process's idle tracker, if any; it gets the tracker back when the run's
        ended cleanly, for the process's next run."""
        self.context = context
        self.uri = tracking_uri(context.mlflow, context.launch_dir)
        self.finished = False
        self._spare = spare
        self._tracker = TrackerProcess(Start(context, self.uri), spare.take() if spare is not None else None)
        self._lock = threading.Lock()
        self._patches: dict[str, str] = {}  # tag -> the patch's fingerprint, or the minibatch's status

    @property
    def run_id(self) -> str | None:
        return self._tracker.run_id

    def __call__(self, event) -> None:
        if isinstance(event, MinibatchEnded):
            patch = event.patch or {}
            self._patches[event.outcome.tag] = str(patch.get("fingerprint") or event.outcome.status)
            # the queue holds what the tracker needs, not the patch itself (it is on disk)
            event = MinibatchEnded(event.outcome, SAVED if event.patch is not None else None)
        elif isinstance(event, Replied):
            if not self.context.mlflow.trace_calls:
                return  # its messages are only needed for a trace
            with self._lock:  # the run dir's record of the trace first: relog and the tracker read it there
                offset = append_trace(self.context.run_dir, trace_record(event))
            event = Recorded(event.tag, event.number, offset)
        self._tracker.outbox.put(event)
        if isinstance(event, (CallStarted, BatchNoted)) and not self._tracker.started:  # a batch: RUNNING as it waits
            self._tracker.start(FIRST_REQUESTS_S)

    def finish(self, summary: dict | None, status: str) -> str | None:
        """Logs what is left and ends the run with `status`, waiting at most `mlflow.deadline_s`."""
        self.finished = True
        record = self.context.run_dir.mlflow_record()
        if not self._tracker.started and status == "FINISHED" and self._up_to_date(record):
            self._hand_back()
            log.info("MLflow run %s already holds this run's patches; left as it is", record["run_id"])
            return record["run_id"]
        deadline_s = self.context.mlflow.deadline_s
        ended = waits_from(summary, deadline_s)
        self._tracker.start(0.0)
        # the tracker gives up a moment before the run stops it, so that it can say why
        left_s = deadline_s - (time.monotonic() - ended) - ANSWER_S
        self._tracker.outbox.put(End(summary, status, self.digest(), max(left_s, ANSWER_S), now_ms()))
        failure = self._tracker.end(ended, deadline_s, busy_allowance(self.uri, deadline_s))
        if not failure:
            self._hand_back()
            return self.run_id
        self._warn(failure)
        # the run's own status too: a sweep's parent counts its jobs from their dirs (reflact.sweeps.jobs)
        incomplete = {"run_id": self.run_id, "tracking_uri": self.uri, "status": "INCOMPLETE", "run_status": status}
        self.context.run_dir.write_mlflow_record(incomplete)
        return None

    def _hand_back(self) -> None:
        """The tracker, idle again, to the spare (when there is one) for the process's next run."""
        idle = self._tracker.release()
        if idle is not None and self._spare is not None:
            self._spare.give(idle)
        elif idle is not None:
            process.end(idle)

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

    def _warn(self, why: str) -> None:
        run_dir = self.context.run_dir.root
        log.warning(
            "MLflow logging to %s failed (%s); the run's outputs are complete in %s. Log them with: "
            "python -m reflact.relog %s",
            self.uri,
            why,
            run_dir,
            run_dir,
        )


class TrackerProcess:
    """The tracker process (reflact.tracking.worker) and the run's side of its pipes: a feeder
    thread pickling the outbox down its stdin, a listener thread reading its answers."""

    def __init__(self, start: Start, idle: subprocess.Popen | None = None) -> None:
        """`idle`: one started already (SpareTracker), else started now."""
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.run_id: str | None = None
        self.started = False
        self._first = start
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._failure = ""  # why the tracker gave up, from its last answer
        self._ready_at: float | None = None  # monotonic: the tracker imported mlflow, or found the store failing
        self._failing = False  # the store's last answer was a failure
        self._migrating = False  # the tracker is migrating a fresh local store
        try:  # at once: it imports what its store needs while the run starts
            self._proc = idle or process.spawn()
            process.write(self._proc, Opening(start.uri))
        except OSError as exc:
            self._failure = f"the tracker process did not start: {exc}"
            self._done.set()

    def release(self) -> subprocess.Popen | None:
        """The process, idle (its run ended cleanly, or it was told of none), no longer this run's."""
        proc, self._proc = self._proc, None
        return proc

    def start(self, delay_s: float) -> None:
        with self._lock:
            if not self.started:
                self.started = True
                threading.Thread(target=self._feed, args=(delay_s,), name="reflact-mlflow", daemon=True).start()

    def end(self, ended: float, deadline_s: float, busy_s: float) -> str:
        """Waits for the tracker's end: an empty answer when it ended the run (the process is
        then idle: `release`), else why not (its own reason, or that it had not written the run
        by its bound: `_bound`), and the process is stopped."""
        answered = self._wait(ended, deadline_s, busy_s)
        failure = self._failure if answered else f"not written within mlflow.deadline_s={deadline_s:g} of the end"
        if failure:
            self._stop()
        return failure

    def _wait(self, ended: float, deadline_s: float, busy_s: float) -> bool:
        """Whether the tracker is done by its bound."""
        while True:
            remaining = self._bound(ended, deadline_s, busy_s) - time.monotonic()
            if remaining <= 0:
                return self._done.is_set()
            if self._done.wait(min(remaining, POLL_S)):  # the tracker's news may change the bound
                return True

    def _bound(self, ended: float, deadline_s: float, busy_s: float) -> float:
        """When the end stops waiting (monotonic). Fixed moments, whatever the tracker still has to
        write: a store that answers slowly, or a backlog, never moves them. From the run's end:
        START_S while the tracker imports mlflow (no store asked yet), `busy_s` while it migrates a
        fresh local store; once it is ready (from then, or from the end), `deadline_s` for a store
        that fails, `busy_s` for one that does not (a local sqlite store busy with other jobs)."""
        if self._migrating:
            return ended + busy_s
        if self._ready_at is None:
            return ended + START_S
        return max(ended, self._ready_at) + (deadline_s if self._failing else busy_s)

    def _feed(self, delay_s: float) -> None:
        """The feeder thread: pipes the tracker process every event, in order."""
        time.sleep(delay_s)
        proc = self._proc
        if proc is None:  # it did not start (spawn says why)
            return
        threading.Thread(target=self._listen, args=(proc,), name="reflact-mlflow-answers", daemon=True).start()
        message: object = self._first
        try:
            while True:
                process.write(proc, message)
                if isinstance(message, End):
                    return
                message = self.outbox.get()
        except OSError:  # the tracker is gone: its answers (or their absence) say why
            return

    def _listen(self, proc: subprocess.Popen) -> None:
        """The tracker's answers: the run's id, its log lines, and its end."""
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                self._take(json.loads(line))
            except ValueError:
                continue
            if self._done.is_set():
                return  # what the process answers next is its next run's
        if not self._done.is_set():
            self._failure = self._failure or f"the tracker process ended with exit code {proc.wait()}"
            self._done.set()

    def _take(self, answer: dict) -> None:
        if answer.keys() & {"ready", "answered", "failing"}:
            self._ready_at = self._ready_at or time.monotonic()
            self._failing = "failing" in answer or (self._failing and "ready" in answer)
        if "migrating" in answer:
            self._migrating = answer["migrating"]
        elif "run_id" in answer:
            self.run_id = answer["run_id"]
        elif "log" in answer:
            log.log(*answer["log"])
        elif "done" in answer:
            self._failure = answer["done"]
            self._done.set()

    def _stop(self) -> None:
        """The tracker process ends, whatever it was waiting on (once it answered that it is done,
        it has nothing left to write: an idle tracker would wait for a next run)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            process.end(proc)


def busy_allowance(uri: str, deadline_s: float) -> float:
    """How long the end of a run waits on a store that is silent without failing: `mlflow.deadline_s`,
    or for a local sqlite file (busy, never down) at least LOCAL_STORE_S."""
    return max(deadline_s, LOCAL_STORE_S) if uri.startswith("sqlite:") else deadline_s


def waits_from(summary: dict | None, deadline_s: float) -> float:
    """When the end's waits count from (monotonic): the stage's last reply, but at most half of
    `mlflow.deadline_s` ago, so that a long analysis after it still leaves the store half of it."""
    return max(_last_reply(summary), time.monotonic() - deadline_s / 2)


def _last_reply(summary: dict | None) -> float:
    """When the stage ended (its last reply), on the monotonic clock: the deadline counts from
    there, so the summary and analysis written since are part of it, not added to it (a long
    analysis still leaves the store half of it: see `finish`)."""
    now = time.monotonic()
    ended_at = (summary or {}).get("times", {}).get("ended_at")
    return now - max(time.time() - ended_at, 0.0) if isinstance(ended_at, (int, float)) else now
