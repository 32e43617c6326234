"""An ended batch's output and error files read into the response cache and the batch's state
(for reflact.running.batch_runner): each line a reply as a live one would be kept, priced at the
batch's tier, or a reason its request was not answered; lines of no request, or a request's second
answer, reported and left out.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from reflact.calls.batches import BatchApi, line_result, read_lines
from reflact.calls.cache import ResponseCache
from reflact.calls.client import redact
from reflact.calls.completion import Completion
from reflact.config import Price
from reflact.core.files import write_text
from reflact.running.ask import capped_cost
from reflact.running.batch_state import BatchState, Submission
from reflact.running.rundir import BatchFiles

log = logging.getLogger("reflact")


@dataclass
class Intake:
    """Collects a batch folder's batches (reflact.running.batch_runner.BatchRunner's parts)."""

    files: BatchFiles
    state: BatchState
    api: Callable[[], BatchApi]
    save: Callable[[], None]
    cache: ResponseCache | None = None
    price: Price | None = None  # the listed price: a line costs the batch's (Price.at)
    secret: str = ""
    tier: str = "batch"  # what its lines cost: the batch's price ("" for a local engine's output: the listed one)
    _warned: set[str] = field(default_factory=set)

    def collect(self, sub: Submission) -> None:
        """An ended batch's lines into the cache and the state (kept files first, on disk)."""
        if sub.status == "failed":
            self._failed_validation(sub)
        else:
            lines = [line for kind in ("output", "errors") for line in self._download(sub, kind)]
            self.take_lines(sub, lines)
        sub.collected = True
        self.save()

    def _download(self, sub: Submission, kind: str) -> list[dict]:
        file_id = sub.output_file_id if kind == "output" else sub.error_file_id
        if not file_id:
            return []
        content = self.api().content(file_id)
        write_text(self.files.downloaded_path(sub.batch_id, kind), content.decode("utf-8", "replace"))
        lines, damaged = read_lines(content)
        if damaged:
            log.warning(
                "batch %s: %d line(s) of its %s file were cut off or damaged; their requests go in the next batch",
                sub.batch_id,
                damaged,
                kind,
            )
        return lines

    def take_lines(self, sub: Submission, lines: list[dict]) -> None:
        """Each line of `sub`'s requests into the cache or the state; other lines are reported."""
        ours, seen, reasons = set(sub.custom_ids), set[str](), Counter[tuple[str, bool]]()
        strangers = doubled = 0
        for line in lines:
            result = line_result(line, self._warn)
            if result is None or result.custom_id not in ours:
                strangers += 1
            elif result.custom_id in seen:
                doubled += 1
            else:
                seen.add(result.custom_id)
                self._take(result.custom_id, result.completion, result.error, result.retryable, sub.batch_id)
                if result.completion is None:
                    reasons[(result.error, result.retryable)] += 1
        for custom_id in ours - seen:
            why = f"not in the output of batch {sub.batch_id} ({sub.status})"
            self._take(custom_id, None, why, True, sub.batch_id)
            reasons[(why, True)] += 1
        report(sub.batch_id, reasons, strangers, doubled)

    def _take(self, key: str, completion: Completion | None, error: str, retryable: bool, batch_id: str) -> None:
        ask = self.state.requests[key]
        if completion is None:
            ask.state, ask.error = ("retry" if retryable else "failed"), error
            return
        entry = {
            "text": redact(completion.text, self.secret),
            "finish_reason": completion.finish_reason,
            "structured": ask.structured,
            "usage": asdict(completion.usage),
            "service_tier": self.tier,
            "batch": batch_id,
        }
        if self.cache is not None:
            self.cache.put_batch(key, entry)
        price = self.price.at(self.tier) if self.price is not None else None
        self.state.spent_usd += capped_cost(completion.usage.cost_usd(price), ask.worst or float("inf"))
        ask.state, ask.error = "done", ""

    def _failed_validation(self, sub: Submission) -> None:
        """A file the server refused as a whole: its line numbers and messages, each line's request failed."""
        by_line = {n: custom_id for n, custom_id in enumerate(sub.custom_ids, 1)}
        first = sub.errors[0]["message"] if sub.errors else "no reason given"
        for error in sub.errors or [{"line": None, "message": first}]:
            where = f"{sub.file} line {error['line']}" if error.get("line") else sub.file
            log.warning("batch %s failed validation: %s: %s", sub.batch_id, where, error["message"])
        own = {by_line.get(e.get("line")): e["message"] for e in sub.errors if by_line.get(e.get("line"))}
        for custom_id in sub.custom_ids:
            ask = self.state.requests[custom_id]
            ask.state = "failed"
            ask.error = f"batch {sub.batch_id} failed validation: {own.get(custom_id, first)}"

    def _warn(self, field: str, what: str) -> None:
        if field not in self._warned:
            self._warned.add(field)
            log.warning("a batch's reply: %s %s (token and cost totals may be off)", field, what)


def report(batch_id: str, reasons: Counter, strangers: int, doubled: int) -> None:
    """One line per distinct reason a request was not answered, and per kind of stray line."""
    for (why, retryable), n in sorted(reasons.items()):
        then = "sent again in the next batch" if retryable else "not sent again"
        log.warning("batch %s: %d request(s) not answered: %s (%s)", batch_id, n, why, then)
    if strangers:
        log.warning("batch %s: %d line(s) name no request of this batch; left out", batch_id, strangers)
    if doubled:
        log.warning("batch %s: %d request(s) answered twice; the first answer kept", batch_id, doubled)
