"""MLflow as a live view of the run dir: an observer of the stage's events.

The stage's threads only put events on a queue; a feeder thread pickles them down a pipe to the
tracker process (reflact.tracking.worker), which opens the store (importing mlflow and migrating
a fresh store take seconds: they overlap the first calls), creates the run (RUNNING, with the
run's real start time) and writes each minibatch's metrics, artifacts and traces as they come.
No call ever waits on it. At the end the run waits for it at most `mlflow.deadline_s`; a store
that is down, frozen or never answers then costs one warning, and the run dir (which holds
every request's trace record too) is logged later by `python -m reflact.relog`.

The process starts with the first request. A rerun that makes none and finds its MLflow run
already holding the same patches under the same settings leaves that run as it is.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import queue
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

import reflact
from reflact.running.events import CallStarted, MinibatchEnded, Replied
from reflact.tracking.mirror import RunContext
from reflact.tracking.store import tracking_uri
from reflact.tracking.worker import End, Start

log = logging.getLogger("reflact")
SAVED: dict = {}  # stands for a saved patch in the queue
# importing mlflow is seconds of CPU: let the first requests go out before the tracker starts it
FIRST_REQUESTS_S = 0.2
# what the parent adds to the deadline for the tracker's own answer before it stops the process
ANSWER_S = 0.5
# how long the tracker may take to import mlflow (no store is involved yet; a busy machine is slow)
START_S = 60.0


class LiveRun:
    """The observer. `finish` ends the MLflow run and returns its id (None when nothing was logged)."""

    def __init__(self, context: RunContext) -> None:
        self.context = context
        self.uri = tracking_uri(context.cfg, context.launch_dir)
        self.run_id: str | None = None
        self.finished = False
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._proc: subprocess.Popen | None = None
        self._feeder: threading.Thread | None = None
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._failure = ""  # why the tracker gave up, from its last answer
        self._ready = False  # the tracker has imported mlflow
        self._answered = 0.0  # monotonic: the store's last answer, as the tracker reported it
        self._patches: dict[str, str] = {}  # tag -> the patch's fingerprint, or the minibatch's status

    def __call__(self, event) -> None:
        if isinstance(event, MinibatchEnded):
            patch = event.patch or {}
            self._patches[event.outcome.tag] = str(patch.get("fingerprint") or event.outcome.status)
            # the queue holds what the tracker needs, not the patch itself (it is on disk)
            event = MinibatchEnded(event.outcome, SAVED if event.patch is not None else None)
        elif isinstance(event, Replied):
            if not self.context.cfg.mlflow.trace_calls:
                return  # its messages are only needed for a trace
            with self._lock:  # the run dir's record of the trace first: relog rebuilds it from there
                self.context.run_dir.append_trace(trace_record(event))
        self._outbox.put(event)
        if isinstance(event, CallStarted) and self._feeder is None:
            self._start(FIRST_REQUESTS_S)

    def finish(self, summary: dict | None, status: str) -> str | None:
        """Logs what is left and ends the run with `status`, waiting at most `mlflow.deadline_s`."""
        self.finished = True
        record = self.context.run_dir.mlflow_record()
        if self._feeder is None and status == "FINISHED" and self._up_to_date(record):
            log.info("MLflow run %s already holds this run's patches; left as it is", record["run_id"])
            return record["run_id"]
        deadline_s = self.context.cfg.mlflow.deadline_s
        self._start(0.0)
        self._outbox.put(End(summary, status, self.digest(), deadline_s))
        answered = self._wait(time.monotonic(), deadline_s)
        self._stop(ANSWER_S if answered else 0.0)
        if not answered or self._failure:
            self._warn(self._failure or f"no answer within mlflow.deadline_s={deadline_s:g}")
            self.context.run_dir.write_mlflow_record({"run_id": self.run_id, "tracking_uri": self.uri,
                                                      "status": "INCOMPLETE"})
            return None
        return self.run_id

    def _wait(self, ended: float, deadline_s: float) -> bool:
        """Whether the tracker is done before the store has been silent for `deadline_s` since
        the run's end (or the tracker took START_S to import mlflow)."""
        while True:
            since = max(ended, self._answered) if self._ready else ended
            remaining = since + (deadline_s + ANSWER_S if self._ready else START_S) - time.monotonic()
            if remaining <= 0:
                return self._done.is_set()
            if self._done.wait(remaining):
                return True

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
            if self._feeder is None:
                self._feeder = threading.Thread(target=self._feed, args=(delay_s,), name="reflact-mlflow", daemon=True)
                self._feeder.start()

    def _feed(self, delay_s: float) -> None:
        """The feeder thread: starts the tracker process, then pipes it every event, in order."""
        time.sleep(delay_s)
        try:
            proc = self._proc = _spawn()
        except OSError as exc:
            self._failure = f"the tracker process did not start: {exc}"
            self._done.set()
            return
        threading.Thread(target=self._listen, args=(proc,), name="reflact-mlflow-answers", daemon=True).start()
        message: object = Start(self.context, self.uri)
        try:
            while True:
                assert proc.stdin is not None
                pickle.dump(message, proc.stdin)
                proc.stdin.flush()
                if isinstance(message, End):
                    return
                message = self._outbox.get()
        except OSError:  # the tracker is gone: its answers (or their absence) say why
            return


    def _listen(self, proc: subprocess.Popen) -> None:
        """The tracker's answers: the run's id, its log lines, and its end."""
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                answer = json.loads(line)
            except ValueError:
                continue
            if "answered" in answer or "ready" in answer:
                self._ready, self._answered = True, time.monotonic()
            elif "run_id" in answer:
                self.run_id = answer["run_id"]
            elif "log" in answer:
                log.log(*answer["log"])
            elif "done" in answer:
                self._failure = answer["done"]
                self._done.set()
        if not self._done.is_set():
            self._failure = self._failure or f"the tracker process ended with exit code {proc.wait()}"
            self._done.set()

    def _stop(self, grace_s: float) -> None:
        """The tracker process ends (given `grace_s` to exit by itself), whatever it was waiting on."""
        proc = self._proc
        if proc is None:
            return
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

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


def trace_record(event: Replied) -> dict:
    """A request as the run dir keeps it for its trace (reflact.relog turns it back into the event)."""
    return {
        "tag": event.tag,
        "number": event.number,
        "messages": event.messages,
        "reply": asdict(event.reply) if event.reply is not None else None,
        "error": event.error,
        "cost_usd": event.cost_usd,
        "ended_at": event.ended_at,
    }


def _spawn() -> subprocess.Popen:
    """The tracker process, importing this very reflact; its own session, so a terminal's signals
    reach only the run (which ends the MLflow run through the pipe)."""
    env = dict(os.environ)
    root = str(Path(reflact.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.Popen(
        [sys.executable, "-m", "reflact.tracking.worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
