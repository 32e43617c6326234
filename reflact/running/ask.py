"""Asking the optimizer about one prompt until it gives a usable reply (SPEC 4).

A reply that does not parse or validate is asked again with the error; one cut off by the
output-token limit is asked again with twice the allowance, up to the ceiling; at most
`reflect.max_reasks` extra requests in all. What the requests cost counts against
`optimizer.max_cost_usd`, shared by all workers of the run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from fractions import Fraction

from reflact.calls.protocol import CallError, Optimizer, Reply
from reflact.config import BatchReasks, Execution, OptimizerConfig, Price, ServiceTier
from reflact.core.modes import Mode
from reflact.replies.parse import ParseError, extract_object
from reflact.replies.patches import CheckedReply, ReplyError, check_reply
from reflact.replies.provenance import with_support_ids
from reflact.running.events import CallStarted, EndpointFailed, Replied
from reflact.running.outcome import Tally

log = logging.getLogger("reflact")


@dataclass
class Asked:
    """What one conversation came to."""

    status: str  # "ok", "failed", "not_run" (cost limit) or "dry_run" (an estimate, nothing called)
    tally: Tally
    checked: CheckedReply | None = None
    parse: str = ""  # ok, or why the last reply was not usable
    error: str = ""


UNITS_PER_USD = 10**12  # money is counted in whole pico-dollars: sums and differences are exact


def units(usd: float) -> int:
    # exact: a float times 10**12 would overflow to infinity past $1.8e296 (a cap meant as "none")
    return round(Fraction(usd) * UNITS_PER_USD)


class Spend:
    """Dollars spent by the run, against `optimizer.max_cost_usd`, shared by the workers. A request
    reserves what it could cost at most before it starts, and settles what it did cost when it
    ends, so the cap holds whatever the number of workers. Amounts are kept in whole units
    (floats would leave residues: four overlapping reservations of $0.11 settled left 2.8e-17
    "in flight" for good); `spent` is what was spent before (an analysis's share of the cap)."""

    def __init__(self, limit: float | None, spent: float = 0.0) -> None:
        self.limit = None if limit is None else units(limit)
        self._spent = units(spent)
        self._reserved = 0
        self._out = 0  # reservations not settled yet
        self._settled = threading.Condition()

    @property
    def spent(self) -> float:
        return self._spent / UNITS_PER_USD

    @property
    def reserved(self) -> float:
        return self._reserved / UNITS_PER_USD

    def reserve(self, worst: float, stopping: threading.Event) -> bool:
        """True when the request may start. While other requests are in flight, waits for them to
        settle (they usually cost less than their worst case); False at once when nothing is in
        flight and it still cannot fit, or on stopping."""
        need = units(worst)
        with self._settled:
            while self.limit is not None and self._spent + self._reserved + need > self.limit:
                if not self._out or stopping.is_set():
                    return False
                self._settled.wait(timeout=1.0)
            self._reserved += need
            self._out += 1
            return True

    def settle(self, worst: float, cost: float) -> None:
        """Ends the reservation of `worst` made by reserve(); `cost` is what the request cost."""
        with self._settled:
            self._reserved -= units(worst)
            self._out -= 1
            self._spent += units(cost)
            self._settled.notify_all()


def worst_cost(messages: list[dict], allowance: int, price: Price | None) -> float:
    """The most a request can cost: a token is at least one byte of the prompt (plus a few for each
    message's role), none of it cached, and the whole output allowance used."""
    if price is None:
        return 0.0
    prompt = sum(len(m["content"].encode("utf-8")) + 8 for m in messages)
    return (prompt * price.input + allowance * price.output) / 1e6


def cap_price(o: OptimizerConfig) -> Price | None:
    """The price a request's worst case is counted at: the dearest of the tiers that may serve it
    (a batch's; the tier asked for live, and the listed one when flex may fall back to auto)."""
    price = o.prices.get(o.model)
    if price is None:
        return None
    live = [o.service_tier.value if o.service_tier not in (ServiceTier.auto, ServiceTier.default) else ""]
    if o.service_tier is ServiceTier.flex and o.flex_fallback_after is not None:
        live.append("")
    batch = o.execution is Execution.batch
    tiers = ["batch", *(live if o.batch_reasks is BatchReasks.live else [])] if batch else live
    dearest = price.at(tiers[0])
    for tier in tiers[1:]:
        dearest = dearest.most(price.at(tier))
    return dearest


def capped_cost(cost: float, worst: float, what: str = "the optimizer's reply") -> float:
    """What a reply is recorded as costing: a server's usage can claim more than the request could
    have cost (more tokens than its prompt's bytes and output allowance); the worst case is then
    what was spent, at most. The analysis's calls (embeddings, the judge) are held to it too."""
    if cost <= worst:
        return cost
    log.warning(
        "%s claims usage worth $%.4f, more than the request could cost ($%.4f); counted as $%.4f",
        what,
        cost,
        worst,
        worst,
    )
    return worst


def failed_call(exc: CallError, tally: Tally) -> Asked:
    """A call that finally failed, counted; the conversation ends here."""
    tally.retries += exc.retries
    tally.failed_calls += 1
    tally.call_log.append({"error": exc.cause, "retries": exc.retries})
    return Asked("failed", tally, error=exc.cause)


def cut_off(allowance: int, ceiling: int) -> tuple[str, int]:
    """Why a cut-off reply was not usable, and the next request's output allowance."""
    if allowance >= ceiling:
        return f"cut off at the output-token ceiling ({allowance})", allowance
    allowance = min(2 * allowance, ceiling)
    return f"cut off by the output-token limit; asking again with {allowance}", allowance


def reask_message(error: str) -> str:
    return (
        f"Your reply could not be used: {error}.\n"
        "Reply again with only the one JSON object, in the format the system prompt describes."
    )


@dataclass(frozen=True, kw_only=True)
class Asker:
    """The settings every conversation of a run shares."""

    optimizer: Optimizer
    mode: Mode
    budget: int
    max_reasks: int
    allowance: int  # the first request's output-token allowance
    ceiling: int  # the largest allowance a cut-off reply is asked again with
    price: Price | None  # the listed price; a reply costs its tier's (Price.at)
    spend: Spend
    schemas: dict[str, dict]  # group -> the reply's JSON schema
    notes_allowed: dict[str, bool]  # group -> may the reply carry appendix_notes
    publish: Callable
    stopping: threading.Event  # set on Ctrl-C or SIGTERM: no new request starts
    provenance: bool = False  # items must name the trajectories they stand on (reflact.replies.provenance)
    worst_price: Price | None = None  # what the cap counts a worst case at (cap_price); default `price`

    def ask(
        self,
        tag: str,
        group: str,
        messages: list[dict],
        numbered_after: int,
        keep: Callable[[int, Reply], None],
        ids: Sequence[str] = (),
        sample: int | None = None,
    ) -> Asked:
        """Requests until a reply is usable; `keep(number, reply)` records each reply as it comes.
        Requests are numbered on from `numbered_after` (the earlier parts' requests). `ids`: the
        trajectories shown, in order (for provenance); `sample`: the draw's sample index, or None."""
        tally, conversation, replies = Tally(), list(messages), list[Reply]()
        allowance, parse = self.allowance, ""
        started = time.monotonic()
        try:
            for attempt in range(self.max_reasks + 1):
                number = numbered_after + len(tally.call_log) + 1
                reply = self._request(tag, (number, keep), group, conversation, allowance, tally, sample)
                if isinstance(reply, Asked):  # the conversation ended unusable: ask afresh next time
                    self.optimizer.forget(replies)
                    return replace(reply, parse=parse)
                if reply.estimated:
                    return Asked("dry_run", tally)
                replies.append(reply)
                tally.reasks += 1 if attempt else 0
                if reply.finish_reason == "length":
                    parse, allowance = cut_off(allowance, self.ceiling)
                    continue
                checked, parse = self._usable(reply, group, list(ids), conversation)
                if checked is not None:
                    return Asked("ok", tally, checked, "ok")
            self.optimizer.forget(replies)
            return Asked("failed", tally, parse=parse, error=f"no usable reply: {parse}")
        except Exception:  # a bug on these replies: a rerun must not replay them from the cache into it
            self.optimizer.forget(replies)
            raise
        finally:  # a dry run or a refused request sent nothing: no latency to time
            tally.latency_s = round(time.monotonic() - started, 3) if tally.call_log else 0.0

    def _usable(
        self, reply: Reply, group: str, ids: list[str], conversation: list[dict]
    ) -> tuple[CheckedReply | None, str]:
        """The reply's checked patch; or None and why not, the re-ask added to the conversation."""
        try:
            return self._checked(reply.text, group, ids), "ok"
        except (ParseError, ReplyError) as exc:
            conversation += [
                {"role": "assistant", "content": reply.text},
                {"role": "user", "content": reask_message(str(exc))},
            ]
            return None, str(exc)

    def _checked(self, text: str, group: str, ids: list[str]) -> CheckedReply:
        """The reply's patch, checked; with provenance, each item's trajectory numbers mapped to ids."""
        checked = check_reply(extract_object(text), self.mode, group, self.budget, self.notes_allowed[group])
        return with_support_ids(checked, self.mode, ids) if self.provenance else checked

    def _request(
        self,
        tag: str,
        numbered: tuple[int, Callable[[int, Reply], None]],
        group: str,
        conversation: list[dict],
        allowance: int,
        tally: Tally,
        sample: int | None = None,
    ) -> Reply | Asked:
        """One request; an Asked when the conversation must end here (stopping, cost limit, failed call).
        `numbered`: the request's number and keep(number, reply), which saves the reply."""
        number, keep = numbered
        if self.stopping.is_set():
            return Asked("failed", tally, error="stopped: the run was interrupted before this request")
        worst = worst_cost(conversation, allowance, self.worst_price or self.price)
        if not self.spend.reserve(worst, self.stopping):
            return Asked("not_run", tally, error="cost limit reached")
        try:
            reply = self._call(tag, number, group, conversation, allowance, sample)
            cost = self._count(reply, allowance, len(conversation), tally, worst)
        except CallError as exc:
            self.spend.settle(worst, 0.0)
            if exc.fatal:
                self.publish(EndpointFailed(exc.fatal))
            asked = failed_call(exc, tally)
            self.publish(Replied(tag, number, list(conversation), None, error=exc.cause))
            return asked
        except BaseException:  # a bug: its traceback goes on, and no worker may wait on its reservation
            self.spend.settle(worst, worst)  # what it may have cost
            raise
        self.spend.settle(worst, 0.0 if reply.estimated else cost)  # first: a full disk must not hold a reservation
        if not reply.estimated:
            keep(number, reply)  # saved before tracking hears of it or it is parsed
        self.publish(Replied(tag, number, list(conversation), reply, cost_usd=cost))
        return reply

    def _call(
        self, tag: str, number: int, group: str, conversation: list[dict], allowance: int, sample: int | None
    ) -> Reply:
        self.publish(CallStarted(tag, number))
        # the sample goes along only with several draws: an optimizer of one's own needs no new argument
        draw = {} if sample is None else {"sample": sample}
        return self.optimizer.complete(conversation, allowance, self.schemas[group], label=tag, **draw)

    def _count(self, reply: Reply, allowance: int, messages: int, tally: Tally, worst: float) -> float:
        """Adds the reply to the tally; returns what it cost now (never more than its `worst`)."""
        tally.usage.add(reply.usage)
        price = self.price.at(reply.service_tier) if self.price is not None else None
        if reply.estimated:
            tally.cost_usd += reply.usage.cost_usd(price)
            return reply.usage.cost_usd(price)
        worth = capped_cost(reply.usage.cost_usd(price), worst)
        tally.cost_usd += worth
        cost = 0.0
        if reply.from_cache:
            tally.cache_hits += 1
        else:
            cost = worth
            tally.calls += 1
            tally.retries += reply.retries
            tally.spent_usd += cost
        tally.call_log.append(call_record(reply, allowance, messages))
        return cost


def call_record(reply: Reply, allowance: int, messages: int) -> dict:
    """A reply's line in its minibatch's call log."""
    return {
        "started_at": reply.started_at,
        "latency_s": round(reply.latency_s, 3),
        "from_cache": reply.from_cache,
        "finish_reason": reply.finish_reason,
        "max_output_tokens": allowance,
        "structured": reply.structured,
        "retries": reply.retries,
        "usage": asdict(reply.usage),
        "messages": messages,
        "service_tier": reply.service_tier,
        **({"batch_id": reply.batch_id} if reply.batch_id else {}),
        **({"flex_unavailable": reply.flex_unavailable} if reply.flex_unavailable else {}),
    }
