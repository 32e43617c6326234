"""A batch's steps against the server, each saved in its state first (reflact.running.batch_state):
input files written, uploaded, batches created, polled, cancelled, and their output and error
files collected into the response cache. The rounds around them are reflact.running.batch's; the
`python -m reflact.batch` tool uses these steps alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from reflact.calls.batches import BatchApi, BatchFault
from reflact.calls.cache import ResponseCache
from reflact.config import Price
from reflact.running.batch_intake import Intake
from reflact.running.batch_state import ENDED, BatchState, Submission, save_state
from reflact.running.rundir import BatchFiles

log = logging.getLogger("reflact")

FIRST_POLL_S = 1.0  # then doubling, up to a minute
LAST_POLL_S = 60.0


@dataclass
class Stop:
    """Why a command does not go on to its stage now: its batches are left to run (`fault`: because
    something failed, not because it was asked to return at once)."""

    message: str
    fault: bool = False


@dataclass
class BatchRunner:
    """The state of one batch folder and the steps that move it on."""

    files: BatchFiles
    state: BatchState
    api: Callable[[], BatchApi]  # made when first needed (a look at the state needs none)
    cache: ResponseCache | None = None
    price: Price | None = None  # the listed price: a line costs the batch's (Price.at)
    notify: Callable[[list[dict], int], None] = lambda notes, step: None  # what tracking shows of the batches
    secret: str = ""

    def save(self) -> None:
        save_state(self.files, self.state)

    def told(self) -> None:
        """Tracking hears how the batches stand; `step` counts over the commands of the batch."""
        self.state.notes += 1
        self.notify([s.note() for s in self.state.submissions if s.batch_id], self.state.notes)

    # ------------------------------------------------------------------ submitting

    def submit(self, sub: Submission, metadata: dict[str, str]) -> None:
        """Uploads the file and creates its batch, the state saved before and after each; a batch
        asked for by a command killed before it noted the id is found and taken, never made twice."""
        if not sub.file_id:
            path = self.files.own_file(sub.file)
            assert path is not None  # the state's own names (checked as they are read)
            sub.file_id = self.api().upload(path)
            sub.status = "uploaded"
            self.save()
        if sub.batch_id:
            return
        found = self.api().find(sub.file_id, sub.creating_since) if sub.creating_since else None
        if found is None:
            sub.creating_since, sub.status = time.time(), "creating"
            self.save()
            found = self.api().create(sub.file_id, metadata)
        sub.take(found)
        self.save()
        log.info("batch %s: %d requests of %s submitted", sub.batch_id, len(sub.custom_ids), sub.file)

    # ------------------------------------------------------------------ waiting

    def poll(self) -> list[Submission]:
        """Looks at every batch not yet ended, once; the ones still running."""
        running = [s for s in self.state.in_flight() if s.batch_id and s.status not in ENDED]
        for sub in running:
            sub.take(self.api().retrieve(sub.batch_id))
            counts = sub.counts
            log.info(
                "batch %s: %s, %s/%s completed, %s failed, %s",
                sub.batch_id,
                sub.status,
                counts.get("completed", "?"),
                counts.get("total", len(sub.custom_ids)),
                counts.get("failed", 0),
                elapsed(sub),
            )
        self.save()
        self.told()
        return [s for s in running if s.status not in ENDED]

    def wait(self, keep_waiting: bool, max_wait_h: float, go_on: str) -> Stop | None:
        """Polls with backoff (up to a minute) until every batch has ended; a Stop when it returns
        first: asked not to wait, a batch past `max_wait_h` from its creation, or polling failed."""
        pause = FIRST_POLL_S
        while True:
            try:
                running = self.poll()
            except BatchFault as exc:
                return Stop(f"{exc}; the batches stay submitted: go on with {go_on}", fault=True)
            if not running:
                return None
            if not keep_waiting:
                return Stop(f"{described(running)} left to run: go on with {go_on}")
            late = [s for s in running if time.time() - s.times.get("created_at", time.time()) > max_wait_h * 3600]
            if late:
                return Stop(
                    f"{described(late)} still unfinished after optimizer.batch_max_wait_h={max_wait_h:g} h; "
                    f"left to run (python -m reflact.batch cancel {self.files.folder.parent} keeps what it "
                    f"finished): go on with {go_on}",
                    fault=True,
                )
            time.sleep(pause)
            pause = min(pause * 2, LAST_POLL_S)

    def collect(self, sub: Submission) -> None:
        """An ended batch's lines into the cache and the state (reflact.running.batch_intake)."""
        Intake(self.files, self.state, self.api, self.save, self.cache, self.price, self.secret).collect(sub)

    def cancel(self) -> list[Submission]:
        """Asks every running batch to stop (what it finished is kept); the ones asked."""
        running = [s for s in self.state.in_flight() if s.batch_id and s.status not in ENDED]
        for sub in running:
            sub.take(self.api().cancel(sub.batch_id))
            log.info("batch %s: %s", sub.batch_id, sub.status)
        self.save()
        self.told()
        return running


def described(subs: list[Submission]) -> str:
    return ", ".join(
        f"batch {s.batch_id} ({s.status}, {s.counts.get('completed', 0)}/{len(s.custom_ids)})" for s in subs
    )


def elapsed(sub: Submission) -> str:
    seconds = int(time.time() - sub.times.get("created_at", time.time()))
    return (
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"
    )
