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
from reflact.tracking import worker
from reflact.tracking.mirror import Batch
from reflact.tracking.process import End
from reflact.tracking.worker import Tracker, _follow, _Messages


@dataclass
class RecordedStore:
    run_id: str = "run"
    tracer_used: bool = False
    writes: list = field(default_factory=list)  # (monotonic time, what, details)

    def traces(self, events: list, model: str) -> None:
        if events:
            self.writes.append((time.monotonic(), "traces", [e.tag for e in events]))


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

    def __init__(self) -> None:
        self.frames: queue.SimpleQueue = queue.SimpleQueue()
        self.answers: list[dict] = []
        context = SimpleNamespace(
            mlflow=SimpleNamespace(trace_calls=True),
            optimizer=SimpleNamespace(model="m"),
            run_dir=SimpleNamespace(write_mlflow_record=lambda record: None),
        )
        self.tracker = Tracker(context, "sqlite:///unused.db", self.answers.append)  # type: ignore[arg-type]
        self.tracker.mirror = RecordedMirror()  # type: ignore[assignment]
        self.thread = threading.Thread(target=_follow, args=(self.tracker, _Messages(self.frames), self.answers.append))
        self.thread.start()

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


def replied(tag: str) -> Replied:
    return Replied(tag, 1, [{"role": "user", "content": tag}], None, "failed")


def ended(tag: str) -> MinibatchEnded:
    return MinibatchEnded(SimpleNamespace(tag=tag, status="done"))  # type: ignore[arg-type]  # what the tracker reads


def test_the_last_minibatch_is_traced_at_once_and_its_metrics_go_with_the_end(monkeypatch):
    feed = Feed()
    try:
        feed.send(Planned(["a", "b"]), replied("a"), ended("a"))  # type: ignore[list-item]
        feed.wait_for("log")  # while calls are in flight, each batch is written as it comes
        # from now on a batch's window would outlast the test: only the stage's end cuts it short
        monkeypatch.setattr(worker, "BATCH_S", 60.0)
        monkeypatch.setattr(worker, "HOLD_S", 60.0)
        feed.send(replied("b"), ended("b"))
        deadline = time.monotonic() + 10
        while ("traces", ["b"]) not in [w[1:] for w in feed.writes]:
            assert time.monotonic() < deadline, f"the last traces waited: {feed.writes}"
            time.sleep(0.01)
    finally:
        feed.close()
    assert [w[1:] for w in feed.writes] == [("traces", ["a"]), ("log", ["a"]), ("traces", ["b"]), ("end", ["b"])]
    assert feed.answers[-1] == {"done": ""}


def test_an_end_slow_to_come_holds_the_last_metrics_back_from_the_live_view_for_the_hold_only(monkeypatch):
    monkeypatch.setattr(worker, "HOLD_S", 0.3)
    feed = Feed()
    try:
        feed.send(Planned(["a"]), replied("a"))  # type: ignore[list-item]
        last_at = feed.send(ended("a"))
        feed.wait_for("log")
        logged_at = next(w[0] for w in feed.writes if w[1] == "log")
        assert logged_at - last_at >= 0.3 - 0.02  # held for the end first
    finally:
        feed.close()
    assert [w[1:] for w in feed.writes] == [("traces", ["a"]), ("log", ["a"]), ("end", [])]  # nothing twice
    assert feed.answers[-1] == {"done": ""}


def test_a_trace_mlflows_tracer_lost_is_written_again_from_the_run_dir_at_the_end(tmp_path, monkeypatch):
    """Once traced, a request leaves the tracker's memory (its record is in the run dir's
    traces.jsonl, written before the tracker sees it), so a long run holds none of the prompts it
    sent; at the end, a request whose trace MLflow's tracer dropped is traced again from there."""
    from reflact.running.rundir import RunDir, append_trace, trace_record

    (tmp_path / "run").mkdir()
    run_dir = RunDir(tmp_path / "run")
    events = [Replied(tag, 1, [{"role": "user", "content": tag}], None, "failed")
              for tag in ("minibatch_fail_000", "minibatch_fail_001")]
    for event in events:
        append_trace(run_dir, trace_record(event))
    context = SimpleNamespace(mlflow=SimpleNamespace(trace_calls=True), optimizer=SimpleNamespace(model="m"),
                              run_dir=run_dir)
    tracker = Tracker(context, "sqlite:///unused.db", lambda message: None)  # type: ignore[arg-type]
    tracker.mirror = RecordedMirror()  # type: ignore[assignment]
    tracker.mirror.store.tracer_used = True  # type: ignore[union-attr]
    for event in events:
        tracker.add(event)
    tracker.flush()
    assert tracker.replied == []
    monkeypatch.setattr(worker, "traced_requests", lambda store: {("minibatch_fail_000", "1")})
    assert tracker.end(End(None, "FINISHED", "", 5.0, 0)) == ""
    assert [w[1:] for w in tracker.mirror.store.writes] == [  # type: ignore[union-attr]
        ("traces", ["minibatch_fail_000", "minibatch_fail_001"]), ("traces", ["minibatch_fail_001"]), ("end", [])]
