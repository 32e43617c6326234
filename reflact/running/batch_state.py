"""A batch's state as its folder keeps it (`batch/state.json`, reflact.running.rundir.BatchFiles):
every input file and the batch made of it, and what each request (by its custom_id, the response
cache's key) came to. reflact.running.batch writes it before each step it takes, so that a
command killed at any moment, or one that returned at once, is resumed from it by the next.

A request is `in_flight` (in an input file whose batch has not been collected), `done` (its reply
is in the response cache), `retry` (expired, cancelled, a 5xx...: another batch may answer it) or
`failed` (the request's own 4xx, a file that failed validation, or too many batches without an
answer: never sent again; its minibatch fails with the reason).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields

from reflact.core.errors import UserError
from reflact.running.rundir import BatchFiles

VERSION = 1
ENDED = ("completed", "expired", "cancelled", "failed")  # a batch's statuses that no longer change
TIMES = ("created_at", "in_progress_at", "finalizing_at", "completed_at", "expired_at", "cancelling_at")
TIMES_TOO = ("cancelled_at", "failed_at", "expires_at")


@dataclass
class Submission:
    """One input file and its batch. `status`: prepared (written), uploaded, creating (asked for,
    id not yet known), then the batch's own (validating, in_progress, finalizing, completed, expired,
    cancelling, cancelled, failed); `collected` once its lines are in the cache."""

    file: str
    custom_ids: list[str]
    round: int
    file_id: str = ""
    batch_id: str = ""
    creating_since: float = 0.0  # epoch: batches.create was asked then
    status: str = "prepared"
    collected: bool = False
    counts: dict = field(default_factory=dict)  # request_counts: completed, failed, total
    times: dict = field(default_factory=dict)  # the batch's status timestamps (epoch seconds)
    usage: dict = field(default_factory=dict)  # the batch's own usage
    output_file_id: str = ""
    error_file_id: str = ""
    errors: list = field(default_factory=list)  # validation errors: {line, message}

    @property
    def in_flight(self) -> bool:
        """Its requests may still be answered by it: not collected, not dropped."""
        return not self.collected and self.status != "dropped"

    def take(self, batch: dict) -> None:
        """What the server says of its batch, as far as it reads."""
        self.batch_id = str(batch.get("id") or self.batch_id)
        self.status = str(batch.get("status") or self.status)
        counts = batch.get("request_counts")
        if isinstance(counts, dict):
            self.counts = {k: v for k, v in counts.items() if k in ("completed", "failed", "total") and _whole(v)}
        self.times = {k: batch[k] for k in (*TIMES, *TIMES_TOO) if _whole(batch.get(k))} or self.times
        if isinstance(batch.get("usage"), dict):
            self.usage = {k: v for k, v in batch["usage"].items() if _whole(v)}
        self.output_file_id = str(batch.get("output_file_id") or "")
        self.error_file_id = str(batch.get("error_file_id") or "")
        errors = (batch.get("errors") or {}).get("data") if isinstance(batch.get("errors"), dict) else None
        if isinstance(errors, list):
            self.errors = [
                {"line": e.get("line"), "message": str(e.get("message"))} for e in errors if isinstance(e, dict)
            ]

    def note(self) -> dict:
        """What tracking shows of it."""
        return {
            "id": self.batch_id,
            "status": self.status,
            "counts": self.counts,
            "times": self.times,
            "usage": self.usage,
        }


@dataclass
class Ask:
    """One request: where it is, how many batches it went in, why it was not answered."""

    state: str = "in_flight"
    attempts: int = 0
    error: str = ""
    structured: str = "off"  # the response format its body holds, as the cache records it
    worst: float = 0.0  # the most it may cost at the batch's price


@dataclass
class BatchState:
    name: str  # the run or sweep it is for
    endpoint: dict  # what the batch tool needs to reach the server again (no key: the variable's name)
    cache_path: str
    submissions: list[Submission] = field(default_factory=list)
    requests: dict[str, Ask] = field(default_factory=dict)
    spent_usd: float = 0.0  # what its collected lines cost (at the batch's price)
    notes: int = 0  # how often tracking was told how the batches stand (its metrics' step)
    updated_at: float = field(default_factory=time.time)

    def in_flight(self) -> list[Submission]:
        return [s for s in self.submissions if s.in_flight]

    def next_file(self) -> int:
        return len(self.submissions) + 1

    def as_json(self) -> dict:
        saved = asdict(self)
        saved["version"] = VERSION
        saved["updated_at"] = time.time()
        return saved


def load_state(files: BatchFiles) -> BatchState | None:
    """The saved state; None when there is none. A damaged one is the user's to look at, named."""
    saved = files.state()
    if saved is None:
        return None
    try:
        if not isinstance(saved, dict) or saved.get("version") != VERSION:
            raise ValueError("not a state of this version")
        known = {f.name for f in fields(BatchState)}
        state = BatchState(**{k: v for k, v in saved.items() if k in known})
        state.submissions = [Submission(**s) for s in saved.get("submissions", [])]
        state.requests = {str(k): Ask(**v) for k, v in saved.get("requests", {}).items()}
        return state
    except (TypeError, ValueError, AttributeError) as exc:
        raise UserError(
            f"{files.state_path}: damaged ({exc}); python -m reflact.batch status {files.folder.parent} shows "
            "what it can, or move the batch folder aside to start the batch anew"
        ) from None


def save_state(files: BatchFiles, state: BatchState) -> None:
    files.write_state(state.as_json())


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
