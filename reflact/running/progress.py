"""The progress display: a line when the stage starts and one per settled minibatch, on stderr.

An observer of the stage's events (reflact.running.events); it keeps its own running totals, so each
line costs the same however long the run.
"""

from __future__ import annotations

import logging
import threading

from reflact.config import OptimizerConfig, ReflectConfig, priced
from reflact.core.groups import FAILURE
from reflact.core.modes import Mode
from reflact.running.events import CallStarted, EndpointFailed, MinibatchEnded, Planned, Replied
from reflact.running.outcome import Outcome

log = logging.getLogger("reflact")


class Progress:
    def __init__(self, reflect: ReflectConfig, optimizer: OptimizerConfig, mode: Mode) -> None:
        self.reflect, self.optimizer = reflect, optimizer
        self.mode = mode
        self.total = self.ended = self.failed = self.in_flight = self.tokens = 0
        self.spent = 0.0
        self.priced = priced(optimizer)
        # the endpoint is unusable: its minibatches' lines would all say so; the run's end line does, once
        self.muted = False
        self._lock = threading.Lock()

    def __call__(self, event) -> None:
        with self._lock:
            if isinstance(event, Planned):
                self._planned(event)
            elif isinstance(event, CallStarted):
                self.in_flight += 1
            elif isinstance(event, Replied):
                self._replied(event)
            elif isinstance(event, EndpointFailed):
                self.muted = True
            elif isinstance(event, MinibatchEnded):
                self.ended += 1
                self.failed += event.outcome.status == "failed"
                if not (self.muted and event.outcome.status == "failed"):
                    self._line(event.outcome)

    def _planned(self, event: Planned) -> None:
        r, k = self.reflect, self.optimizer.samples
        self.total = len(event.plan)
        n_fail = sum(1 for mb in event.plan if mb.group == FAILURE.name and not mb.draw)
        draws = f" x {k} draws" if k > 1 else ""
        log.info(
            "reflect: %d minibatches%s (%d failure, %d success), M=%d L=%d mode=%s workers=%d%s",
            self.total // k,
            draws,
            n_fail,
            self.total // k - n_fail,
            r.minibatch_size,
            r.edit_budget,
            self.mode.name,
            r.workers,
            " (dry run: no calls)" if self.optimizer.dry_run else "",
        )

    def _replied(self, event: Replied) -> None:
        self.in_flight -= 1
        if event.reply is not None and not event.reply.from_cache:
            self.tokens += event.reply.usage.prompt + event.reply.usage.completion
            self.spent += event.cost_usd

    def _line(self, o: Outcome) -> None:
        detail = {
            "done": f"{o.kept}/{o.proposed} {self.mode.label} kept",
            "reused": "reused saved patch",
            "skipped": "no trajectories to show",
            "dry_run": f"~{o.usage.prompt} prompt tokens",
            "failed": f"FAILED: {o.error}",
            "not_run": "not run: cost limit reached",
        }[o.status]
        extras = f", {o.reasks} re-ask(s)" if o.reasks else ""
        extras += f", {o.retries} retr{'y' if o.retries == 1 else 'ies'}" if o.retries else ""
        extras += f", {o.cache_hits} from cache" if o.cache_hits else ""
        log.info(
            # no "[n/m]" counter: a trainer calling reflact logs its own stage tags that way
            "reflact: %*d of %d ended, %s (%d trajs): %s%s | failed %d, in flight %d, %s tokens, %s",
            len(str(self.total)),
            self.ended,
            self.total,
            o.tag,
            o.analysed,
            detail,
            extras,
            self.failed,
            self.in_flight,
            f"{self.tokens:,}",
            f"${self.spent:.4f}" if self.priced else "cost unknown",
        )
