"""The reflect stage (SPEC 2): split, shuffle, minibatches, one call each, patches on disk, resume."""

from __future__ import annotations

import hashlib
import json
import logging
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from reflact.client import CallError, OptimizerClient, Reply, Usage, estimate_tokens
from reflact.config import ContextOverflow, ReflactConfig
from reflact.dataset import Dataset, Result, load_trajectory
from reflact.files import read_json, write_json, write_text
from reflact.modes import Mode, get_mode, reply_schema
from reflact.parse import ParseError, extract_object
from reflact.patches import CheckedReply, ReplyError, check_reply, merge_replies
from reflact.prompts import SystemPrompts, resolve_system_prompts, text_or_file, user_message
from reflact.render import render_block

log = logging.getLogger("reflact")

GROUP_TAG = {"failure": "fail", "success": "succ"}
# a dry run's guess of a reply's length: edits or suggestions are short, a full rewrite is a whole skill
DRY_RUN_REPLY_TOKENS = 1500
SHORTEN_STEPS = (16000, 8000, 4000, 2000, 1000, 500, 200)  # characters per item, tried in turn


@dataclass(frozen=True)
class Minibatch:
    group: str  # "failure" or "success"
    index: int
    results: list[Result]

    @property
    def tag(self) -> str:
        return f"minibatch_{GROUP_TAG[self.group]}_{self.index:03d}"


@dataclass
class Outcome:
    """What happened to one minibatch.

    `status`: done, reused (a matching saved patch), failed, skipped (nothing to show),
    not_run (the cost limit was reached) or dry_run.
    """

    tag: str
    group: str
    index: int
    ids: list[str]
    status: str = "done"
    analysed: int = 0
    skipped: int = 0
    proposed: int = 0
    kept: int = 0
    calls: int = 0
    failed_calls: int = 0
    reasks: int = 0
    retries: int = 0
    cache_hits: int = 0
    usage: Usage = field(default_factory=Usage)  # tokens behind the patch, whenever they were spent
    cost_usd: float = 0.0  # what the patch cost (its usage priced)
    spent_usd: float = 0.0  # what this run paid: calls made now, not cache hits or reused patches
    latency_s: float = 0.0
    parts: int = 1  # calls the minibatch was split into to fit the context window
    shortened: int = 0  # when items were shortened to fit: their new length in characters
    parse: str = ""  # ok, or why the last reply was not usable
    error: str = ""
    call_log: list[dict] = field(default_factory=list)  # one record per request or cache hit

    @property
    def truncated(self) -> int:
        return self.proposed - self.kept


def split(results: list[Result], threshold: float, failure_only: bool) -> tuple[list[Result], list[Result]]:
    failures = [r for r in results if r.hard < threshold]
    successes = [] if failure_only else [r for r in results if r.hard >= threshold]
    return failures, successes


def shuffled(items: list, seed: int) -> list:
    """A permutation that depends on the seed only, never on M, so smaller M refines larger M."""
    order = list(items)
    random.Random(seed).shuffle(order)
    return order


def chunks(items: list, size: int) -> list[list]:
    return [items[start : start + size] for start in range(0, len(items), size)]


def plan_minibatches(results: list[Result], cfg: ReflactConfig) -> list[Minibatch]:
    r = cfg.reflect
    failures, successes = split(results, r.success_threshold, r.failure_only)
    plan = [Minibatch("failure", i, b) for i, b in enumerate(chunks(shuffled(failures, r.seed), r.minibatch_size))]
    plan += [Minibatch("success", i, b) for i, b in enumerate(chunks(shuffled(successes, r.seed + 1), r.minibatch_size))]
    return plan


def fingerprint(cfg: ReflactConfig, messages: list[dict]) -> str:
    """Everything that shapes the call: model, mode, L, decoding settings, and both messages
    (which hold the templates, the skill, the contexts and the trajectories)."""
    o = cfg.optimizer
    shape = {
        "model": o.model,
        "mode": cfg.reflect.update_mode,
        "budget": cfg.reflect.edit_budget,
        "temperature": o.temperature,
        "reasoning_effort": o.reasoning_effort,
        "sample": o.sample,
        "messages": messages,
    }
    return hashlib.sha256(json.dumps(shape, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def reask_message(error: str) -> str:
    return (
        f"Your reply could not be used: {error}.\n"
        "Reply again with only the one JSON object, in the format the system prompt describes."
    )


@dataclass
class Ready:
    """A minibatch whose prompts are built and written, waiting for a free call slot."""

    mb: Minibatch
    outcome: Outcome
    parts: list[list[dict]]  # the messages of each call (more than one when split to fit)
    fingerprint: str
    call_dir: Path


class Spend:
    """Dollars spent by the run so far, against `optimizer.max_cost_usd`; shared by the workers."""

    def __init__(self, limit: float | None) -> None:
        self.limit = limit
        self.spent = 0.0
        self.tokens = 0
        self._lock = threading.Lock()

    def allows_new_call(self) -> bool:
        with self._lock:
            return self.limit is None or self.spent < self.limit

    def add(self, usage: Usage, cost: float) -> None:
        with self._lock:
            self.spent += cost
            self.tokens += usage.prompt + usage.completion


class Stage:
    """One run of the reflect stage over a dataset, writing into `run_dir`."""

    def __init__(self, cfg: ReflactConfig, dataset: Dataset, client: OptimizerClient | None, run_dir: Path) -> None:
        self.cfg = cfg
        self.dataset = dataset
        self.client = client
        self.mode: Mode = get_mode(cfg.reflect.update_mode)
        self.patches_dir = run_dir / "patches"
        self.calls_dir = run_dir / "calls"
        # resolved before any call, so a bad override path stops the run with nothing spent
        overrides = {"failure": cfg.prompts.error, "success": cfg.prompts.success}
        self.system: SystemPrompts = resolve_system_prompts(overrides, self.mode, cfg.reflect)
        self.step_buffer = text_or_file(cfg.reflect.step_buffer, "reflect.step_buffer") or ""
        self.meta_skill = text_or_file(cfg.reflect.meta_skill, "reflect.meta_skill") or ""
        self.price = cfg.optimizer.prices.get(cfg.optimizer.model)
        self.schemas = {group: reply_schema(self.mode, group, self.system.notes_allowed[group])
                        for group in ("failure", "success")}
        self.spend = Spend(cfg.optimizer.max_cost_usd)
        self._in_flight = 0
        self._lock = threading.Lock()

    @property
    def max_output_tokens(self) -> int:
        o = self.cfg.optimizer
        return o.max_output_tokens_full_rewrite if self.mode.full_rewrite else o.max_output_tokens

    def run(self) -> list[Outcome]:
        plan = plan_minibatches(self.dataset.results, self.cfg)
        r = self.cfg.reflect
        n_fail = sum(1 for mb in plan if mb.group == "failure")
        log.info(
            "reflect: %d minibatches (%d failure, %d success), M=%d L=%d mode=%s workers=%d%s",
            len(plan), n_fail, len(plan) - n_fail, r.minibatch_size, r.edit_budget, self.mode.name,
            r.workers, " (dry run: no calls)" if self.client is None else "",
        )
        self.patches_dir.mkdir(parents=True, exist_ok=True)
        for leftover in [*self.patches_dir.glob(".*.tmp"), *self.calls_dir.glob("*/.*.tmp")]:
            leftover.unlink()  # half-written files of a run that was killed
        outcomes: dict[str, Outcome] = {}
        lock = threading.Lock()

        def record(outcome: Outcome) -> None:
            with lock:
                outcomes[outcome.tag] = outcome
                self._progress(outcome, list(outcomes.values()), len(plan))

        # This thread renders the minibatches in plan order while the workers call: a call can
        # start the moment a slot is free. `window` bounds the prompts held (ready or in flight).
        window = threading.BoundedSemaphore(2 * r.workers)

        def finished(future) -> None:
            try:
                if future.exception() is None:
                    record(future.result())
            finally:
                window.release()

        with ThreadPoolExecutor(max_workers=r.workers) as pool:
            futures = []
            for mb in plan:
                window.acquire()
                ready = self.prepare(mb)
                if isinstance(ready, Outcome):
                    record(ready)
                    window.release()
                    continue
                future = pool.submit(self.execute, ready)
                future.add_done_callback(finished)
                futures.append(future)
            for future in futures:
                future.result()  # a worker's exception surfaces here
        if any(o.status == "not_run" for o in outcomes.values()):
            log.warning("the cost limit optimizer.max_cost_usd=%s was reached: %d minibatch(es) not run",
                        self.cfg.optimizer.max_cost_usd, sum(o.status == "not_run" for o in outcomes.values()))
        return [outcomes[mb.tag] for mb in plan]  # failures by index, then successes

    def _progress(self, o: Outcome, finished: list[Outcome], total: int) -> None:
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
        failed = sum(1 for f in finished if f.status == "failed")
        with self._lock:
            in_flight = self._in_flight
        log.info(
            "[%*d/%d] %s (%d trajs): %s%s | failed %d, in flight %d, %s tokens, $%.4f",
            len(str(total)), len(finished), total, o.tag, o.analysed, detail, extras,
            failed, in_flight, f"{self.spend.tokens:,}", self.spend.spent,
        )

    def prepare(self, mb: Minibatch) -> "Ready | Outcome":
        """The minibatch's prompts, written to its call dir; or its final outcome when it needs
        no call (nothing to show, a matching saved patch, a dry run)."""
        ids = [r.id for r in mb.results]
        outcome = Outcome(tag=mb.tag, group=mb.group, index=mb.index, ids=ids)
        shown = [r for r in mb.results if r.id not in self.dataset.skipped]
        outcome.skipped = len(ids) - len(shown)
        outcome.analysed = len(shown)
        if not shown:
            outcome.status = "skipped"
            return outcome
        parts = self._fit(mb, shown, outcome)
        fp = fingerprint(self.cfg, [m for part in parts for m in part])
        saved = read_json(self.patches_dir / f"{mb.tag}.json")
        if isinstance(saved, dict) and saved.get("fingerprint") == fp:
            return self._reused(outcome, saved)
        call_dir = self.calls_dir / mb.tag
        for old in [*call_dir.glob("reply_*.txt"), *call_dir.glob("user_*.md")]:  # from an earlier, stale attempt
            old.unlink()
        write_text(call_dir / "system.md", parts[0][0]["content"])
        for number, part in enumerate(parts, 1):
            write_text(call_dir / ("user.md" if number == 1 else f"user_{number}.md"), part[1]["content"])
        if self.client is None:
            self._estimate(outcome, [m for part in parts for m in part])
            write_json(call_dir / "outcome.json", asdict(outcome), indent=None)
            return outcome
        return Ready(mb, outcome, parts, fp, call_dir)

    def execute(self, ready: "Ready") -> Outcome:
        """The call(s) of a prepared minibatch, then its patch and record."""
        mb, outcome, call_dir = ready.mb, ready.outcome, ready.call_dir
        checked = []
        for part in ready.parts:
            result = self._call(mb, part, outcome, call_dir)
            if result is None:
                break
            checked.append(result)
        if len(checked) == len(ready.parts):
            merged = checked[0] if len(checked) == 1 else merge_replies(checked, self.mode, self.cfg.reflect.edit_budget)
            outcome.proposed, outcome.kept = merged.proposed, merged.kept
            patch = {
                **merged.obj,
                "source_type": mb.group,
                "trajectory_ids": outcome.ids,
                "n_analysed": outcome.analysed,
                "n_proposed": merged.proposed,
                "fingerprint": ready.fingerprint,
            }
            # the record first: a patch on disk (what resume trusts) always has its record
            write_json(call_dir / "outcome.json", asdict(outcome), indent=None)
            write_json(self.patches_dir / f"{mb.tag}.json", patch, durable=True)
            return outcome
        write_json(call_dir / "outcome.json", asdict(outcome), indent=None)
        return outcome

    def _fit(self, mb: Minibatch, shown: list[Result], outcome: Outcome) -> list[list[dict]]:
        """The messages of the call(s) for a minibatch, within `optimizer.context_window`.

        A prompt that would not fit is split into halves (full rewrite, a single trajectory, or
        context_overflow=shorten: its longest items are shortened in the middle instead).
        """
        messages = self._messages(mb.group, shown)
        if self._fits(messages):
            return [messages]
        window = self.cfg.optimizer.context_window
        can_split = len(shown) > 1 and not self.mode.full_rewrite
        if self.cfg.optimizer.context_overflow is ContextOverflow.split and can_split:
            half = (len(shown) + 1) // 2
            outcome.parts += 1
            log.info("%s: ~%d prompt tokens do not fit optimizer.context_window=%d; splitting %d trajectories "
                     "into %d + %d", mb.tag, estimate_tokens(messages), window, len(shown), half, len(shown) - half)
            return self._fit(mb, shown[:half], outcome) + self._fit(mb, shown[half:], outcome)
        for limit in SHORTEN_STEPS:
            messages = self._messages(mb.group, shown, max_item_chars=limit)
            if self._fits(messages):
                break
        outcome.shortened = limit
        if self._fits(messages):
            log.info("%s: items shortened to %d characters to fit optimizer.context_window=%d (~%d prompt tokens)",
                     mb.tag, limit, window, estimate_tokens(messages))
        else:
            log.warning("%s: ~%d prompt tokens still exceed optimizer.context_window=%d with items shortened to %d "
                        "characters (the skill and templates alone are too long?); calling anyway",
                        mb.tag, estimate_tokens(messages), window, limit)
        return [messages]

    def _fits(self, messages: list[dict]) -> bool:
        window = self.cfg.optimizer.context_window
        # chars/4 is a rough count: keep a tenth of the window in reserve
        return window is None or estimate_tokens(messages) + self.max_output_tokens <= 0.9 * window

    def _reused(self, outcome: Outcome, saved: dict) -> Outcome:
        """A saved patch stands; its record keeps what it cost when it was made, so a resumed
        run or sweep cell still compares on tokens and cost."""
        outcome.status = "reused"
        outcome.proposed = int(saved.get("n_proposed", 0))
        outcome.kept = len((saved.get("patch") or {}).get(self.mode.payload_key) or [])
        outcome.parse = "ok"
        earlier = read_json(self.calls_dir / outcome.tag / "outcome.json")
        if isinstance(earlier, dict):
            outcome.usage = Usage(**earlier.get("usage", {}))
            outcome.cost_usd = float(earlier.get("cost_usd", 0.0))
            outcome.reasks = int(earlier.get("reasks", 0))
            outcome.latency_s = float(earlier.get("latency_s", 0.0))
        return outcome

    def _estimate(self, outcome: Outcome, messages: list[dict]) -> None:
        """A dry run's figures: the prompt's tokens, a typical reply's, and their price."""
        reply_tokens = DRY_RUN_REPLY_TOKENS + (len(self.dataset.skill) // 4 if self.mode.full_rewrite else 0)
        outcome.status = "dry_run"
        outcome.usage = Usage(prompt=estimate_tokens(messages), completion=reply_tokens)
        outcome.cost_usd = outcome.usage.cost_usd(self.price)
        self.spend.add(outcome.usage, outcome.cost_usd)

    def _messages(self, group: str, shown: list[Result], max_item_chars: int | None = None) -> list[dict]:
        blocks = []
        for position, result in enumerate(shown, 1):
            t = load_trajectory(self.dataset, result)
            blocks.append(render_block(position, len(shown), result.id, t.fields, t.extras, t.conversation,
                                       max_item_chars))
        system = self.system.failure if group == "failure" else self.system.success
        user = user_message(
            self.dataset.skill, self.mode, self.cfg.reflect.edit_budget, group, blocks, self.step_buffer, self.meta_skill
        )
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    def _call(self, mb: Minibatch, messages: list[dict], outcome: Outcome, call_dir: Path) -> CheckedReply | None:
        """One call plus at most `reflect.max_reasks` re-asks; None when it finally failed.

        A reply that does not parse or validate is re-asked with the error; one cut off by the
        output-token limit is asked again with twice the allowance (up to the ceiling).
        """
        conversation = list(messages)
        allowance = self.max_output_tokens
        schema = self.schemas[mb.group]
        replies: list[Reply] = []
        started = time.monotonic()
        try:
            for attempt in range(self.cfg.reflect.max_reasks + 1):
                reply = self._one_call(conversation, allowance, schema, outcome)
                if reply is None:
                    self.client.forget(replies)  # the conversation ended unusable: ask afresh next time
                    return None
                replies.append(reply)
                write_text(call_dir / f"reply_{len(outcome.call_log)}.txt", reply.text)
                outcome.reasks += 1 if attempt else 0
                if reply.finish_reason == "length":
                    if allowance >= self.cfg.optimizer.max_output_tokens_ceiling:
                        outcome.parse = f"cut off at the output-token ceiling ({allowance})"
                        continue
                    allowance = min(2 * allowance, self.cfg.optimizer.max_output_tokens_ceiling)
                    outcome.parse = f"cut off by the output-token limit; asking again with {allowance}"
                    continue
                try:
                    checked = check_reply(
                        extract_object(reply.text), self.mode, mb.group, self.cfg.reflect.edit_budget,
                        self.system.notes_allowed[mb.group],
                    )
                except (ParseError, ReplyError) as exc:
                    outcome.parse = str(exc)
                    conversation += [
                        {"role": "assistant", "content": reply.text},
                        {"role": "user", "content": reask_message(str(exc))},
                    ]
                    continue
                outcome.parse = "ok"
                return checked
            outcome.status, outcome.error = "failed", f"no usable reply: {outcome.parse}"
            self.client.forget(replies)
            return None
        finally:
            outcome.latency_s = round(outcome.latency_s + time.monotonic() - started, 3)
            outcome.cost_usd = outcome.usage.cost_usd(self.price)

    def _one_call(self, conversation: list[dict], allowance: int, schema: dict, outcome: Outcome) -> Reply | None:
        if not self.spend.allows_new_call():
            outcome.status, outcome.error = "not_run", "cost limit reached"
            return None
        with self._lock:
            self._in_flight += 1
        try:
            reply = self.client.complete(conversation, allowance, schema)
        except CallError as exc:
            outcome.retries += exc.retries
            outcome.failed_calls += 1
            outcome.status, outcome.error = "failed", exc.cause
            outcome.call_log.append({"error": exc.cause, "retries": exc.retries})
            return None
        finally:
            with self._lock:
                self._in_flight -= 1
        outcome.usage.add(reply.usage)
        if reply.from_cache:
            outcome.cache_hits += 1
        else:
            cost = reply.usage.cost_usd(self.price)
            outcome.calls += 1
            outcome.retries += reply.retries
            outcome.spent_usd += cost
            self.spend.add(reply.usage, cost)
        outcome.call_log.append({
            "started_at": reply.started_at, "latency_s": round(reply.latency_s, 3), "from_cache": reply.from_cache,
            "finish_reason": reply.finish_reason, "max_output_tokens": allowance, "structured": reply.structured,
            "retries": reply.retries, "usage": asdict(reply.usage), "messages": len(conversation),
        })
        return reply
