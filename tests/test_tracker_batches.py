"""How the tracker process batches what the stage sends: while calls are in flight, each batch's
traces, metrics and files are written as they come (the live view); the stage's last minibatch
has its traces written at once, and its metrics and files wait for the run's end (its summary
and analysis follow) to be written with the end's own in one write; an end that is slow to come
does not keep them from the live view for more than `HOLD_S`.

The tracker's loop (reflact.tracking.worker._follow) is fed pickled frames as its stdin would
carry them; the MLflow side is a recorder of what was written when, since the store's own
behaviour is covered by the end-to-end tests (test_live, test_traces).
"""

from __future__ import annotations

import pickle
import queue
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

from reflact.running.events import MinibatchEnded, Planned, Replied
from reflact.running.rundir import RunDir, append_trace, trace_record
from reflact.tracking import worker
from reflact.tracking.mirror import Batch
from reflact.tracking.process import End, Recorded
from reflact.tracking.worker import Tracker, _follow, _Messages


@dataclass
class RecordedStore:
    run_id: str = "run"
    tracer_used: bool = False
    failing: bool = False  # every write raises
    writes: list = field(default_factory=list)  # (monotonic time, what, details)
    events: list = field(default_factory=list)  # the requests traced, as the tracker gave them

    def traces(self, events: list, model: str) -> None:
        if self.failing:
            raise ConnectionError("the store is down")
        if events:
            self.writes.append((time.monotonic(), "traces", [e.tag for e in events]))
            self.events += events


class RecordedMirror:
    """Mirror's interface: rows are the minibatches' tags."""

    def __init__(self) -> None:
        self.store = RecordedStore()

    def batch(self, events: list) -> Batch:
        tags = [e.outcome.tag for e in events if isinstance(e, MinibatchEnded)]
        return Batch(rows=[(tag, 1.0, 0) for tag in tags])

    def log(self, batch: Batch) -> None:
        self.store.writes.append((time.monotonic(), "log", [row[0] for row in batch.rows]))

    def end(self, summary, status, end_ms=None, last=None) -> None:
        self.ended_ms = end_ms
        self.store.writes.append((time.monotonic(), "end", [row[0] for row in (last or Batch()).rows]))


class Feed:
    """The tracker's loop on a thread of its own, fed frames the way its stdin's reader feeds them."""

    def __init__(self, run_dir: RunDir) -> None:
        self.frames: queue.SimpleQueue = queue.SimpleQueue()
        self.answers: list[dict] = []
        self.run_dir = run_dir
        context = SimpleNamespace(mlflow=SimpleNamespace(trace_calls=True), optimizer=SimpleNamespace(model="m"),
                                  run_dir=run_dir)
        self.tracker = Tracker(context, "sqlite:///unused.db", self.answers.append)  # type: ignore[arg-type]
        self.tracker.mirror = RecordedMirror()  # type: ignore[assignment]
        self.thread = threading.Thread(target=_follow, args=(self.tracker, _Messages(self.frames), self.answers.append))
        self.thread.start()

    def replied(self, tag: str) -> Recorded:
        """A failed request of minibatch `tag`, recorded in the run dir as the run records it."""
        return recorded(self.run_dir, tag)

    def send(self, *messages: object) -> float:
        for message in messages:
            self.frames.put(pickle.dumps(message))
        return time.monotonic()

    @property
    def writes(self) -> list:
        return self.tracker.mirror.store.writes  # type: ignore[union-attr]

    def wait_for(self, what: str, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not any(w[1] == what for w in self.writes):
            assert time.monotonic() < deadline, f"no {what} write within {timeout} s: {self.writes}"
            time.sleep(0.01)

    def close(self) -> None:
        self.send(End(None, "FINISHED", "", 5.0, 0))
        self.thread.join(10)
        assert not self.thread.is_alive()


def recorded(run_dir: RunDir, tag: str) -> Recorded:
    """A failed request of minibatch `tag`, its record appended to the run dir's traces.jsonl, and
    the message the run sends the tracker for it."""
    event = Replied(tag, 1, [{"role": "user", "content": tag}], None, "failed")
    return Recorded(tag, 1, append_trace(run_dir, trace_record(event)))


A, B = "minibatch_fail_000", "minibatch_fail_001"  # two minibatches' tags


def a_run_dir(tmp_path) -> RunDir:
    (tmp_path / "run").mkdir()
    return RunDir(tmp_path / "run")


def ended(tag: str) -> MinibatchEnded:
    return MinibatchEnded(SimpleNamespace(tag=tag, status="done"))  # type: ignore[arg-type]  # what the tracker reads


def test_the_last_minibatch_is_traced_at_once_and_its_metrics_go_with_the_end(tmp_path, monkeypatch):
    feed = Feed(a_run_dir(tmp_path))
    try:
        feed.send(Planned([A, B]), feed.replied(A), ended(A))  # type: ignore[list-item]
        feed.wait_for("log")  # while calls are in flight, each batch is written as it comes
        # from now on a batch's window would outlast the test: only the stage's end cuts it short
        monkeypatch.setattr(worker, "BATCH_S", 60.0)
        monkeypatch.setattr(worker, "HOLD_S", 60.0)
        feed.send(feed.replied(B), ended(B))
        deadline = time.monotonic() + 10
        while ("traces", [B]) not in [w[1:] for w in feed.writes]:
            assert time.monotonic() < deadline, f"the last traces waited: {feed.writes}"
            time.sleep(0.01)
    finally:
        feed.close()
    assert [w[1:] for w in feed.writes] == [("traces", [A]), ("log", [A]), ("traces", [B]), ("end", [B])]
    assert feed.answers[-1] == {"done": ""}


def test_an_end_slow_to_come_holds_the_last_metrics_back_from_the_live_view_for_the_hold_only(tmp_path, monkeypatch):
    monkeypatch.setattr(worker, "HOLD_S", 0.3)
    feed = Feed(a_run_dir(tmp_path))
    try:
        feed.send(Planned([A]), feed.replied(A))  # type: ignore[list-item]
        last_at = feed.send(ended(A))
        feed.wait_for("log")
        logged_at = next(w[0] for w in feed.writes if w[1] == "log")
        assert logged_at - last_at >= 0.3 - 0.02  # held for the end first
    finally:
        feed.close()
    assert [w[1:] for w in feed.writes] == [("traces", [A]), ("log", [A]), ("end", [])]  # nothing twice
    assert feed.answers[-1] == {"done": ""}


def test_the_tracker_traces_each_request_from_its_record_and_a_lost_one_again_at_the_end(tmp_path, monkeypatch):
    """The run tells the tracker where each request's record is in the run dir's traces.jsonl
    (written before the tracker hears of it), not the request itself: a tracker behind the run
    holds none of the prompts it sent. It traces what the record holds, and at the end a request
    whose trace MLflow's tracer dropped is traced again from there."""
    run_dir = a_run_dir(tmp_path)
    prompts = {A: "a long prompt " * 1000, B: "another " * 1000}
    sent = []
    for tag, prompt in prompts.items():
        event = Replied(tag, 1, [{"role": "user", "content": prompt}], None, "failed")
        sent.append(Recorded(tag, 1, append_trace(run_dir, trace_record(event))))
    assert max(len(pickle.dumps(message)) for message in sent) < 200  # the prompts are 8-14 KB
    context = SimpleNamespace(mlflow=SimpleNamespace(trace_calls=True), optimizer=SimpleNamespace(model="m"),
                              run_dir=run_dir)
    tracker = Tracker(context, "sqlite:///unused.db", lambda message: None)  # type: ignore[arg-type]
    tracker.mirror = RecordedMirror()  # type: ignore[assignment]
    store = tracker.mirror.store  # type: ignore[union-attr]
    store.tracer_used = True
    for message in sent:
        tracker.add(message)
    tracker.flush()
    assert tracker.recorded == []
    assert [(e.tag, e.messages[0]["content"], e.error) for e in store.events] == [
        (A, prompts[A], "failed"), (B, prompts[B], "failed")]
    monkeypatch.setattr(worker, "traced_requests", lambda store: {(A, "1")})
    assert tracker.end(End(None, "FINISHED", "", 5.0, 0)) == ""
    assert [w[1:] for w in store.writes] == [("traces", [A, B]), ("traces", [B]), ("end", [])]
    assert store.events[-1].messages[0]["content"] == prompts[B]


def test_a_failed_trace_write_keeps_its_requests_for_the_next_try(tmp_path):
    """A store that fails a write loses none of the requests waiting to be traced, new or of a
    reused minibatch: the next try traces each of them once."""
    run_dir = a_run_dir(tmp_path)
    earlier = recorded(run_dir, A)  # made by an earlier run of the dir: its minibatch is reused now
    context = SimpleNamespace(mlflow=SimpleNamespace(trace_calls=True), optimizer=SimpleNamespace(model="m"),
                              run_dir=run_dir)
    tracker = Tracker(context, "sqlite:///unused.db", lambda message: None)  # type: ignore[arg-type]
    tracker.mirror = RecordedMirror()  # type: ignore[assignment]
    store = tracker.mirror.store  # type: ignore[union-attr]
    tracker.add(MinibatchEnded(SimpleNamespace(tag=earlier.tag, status="reused")))  # type: ignore[arg-type]
    tracker.add(recorded(run_dir, B))
    store.failing = True
    assert not tracker.attempt()
    store.failing = False
    tracker.backoff.next_at = 0.0
    assert tracker.attempt()
    assert [w[1:] for w in store.writes] == [("traces", [B, A]), ("log", [A])]
