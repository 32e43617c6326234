"""The reflect stage (SPEC 2): the plan's minibatches, one conversation each, patches in the run dir.

`Stage.run` only orchestrates: the launching thread prepares minibatches in plan order (prompt
built and written, or a saved patch reused) while a pool of workers asks the optimizer; at most
2 x workers prompts are held at once. Planning, prompts, asking and the run dir's layout live in
their own modules; observers (progress, live tracking) follow along through events.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from reflact.calls.protocol import Optimizer, output_allowance
from reflact.config import OptimizerConfig, PromptsConfig, ReflectConfig, shape
from reflact.core.errors import StopSignal
from reflact.core.groups import GROUPS
from reflact.core.modes import Mode, get_mode, reply_schema
from reflact.inputs.dataset import Dataset
from reflact.prompting.messages import Prompt, PromptBuilder
from reflact.prompting.plan import Minibatch, plan_minibatches, with_draws
from reflact.prompting.prompts import SystemPrompts, overrides_of, resolve_system_prompts, text_or_file
from reflact.replies.patches import merge_replies
from reflact.running.ask import Asker, Spend, cap_price
from reflact.running.events import MinibatchEnded, Observer, Planned, Publisher
from reflact.running.outcome import Outcome, Tally
from reflact.running.progress import Progress
from reflact.running.reuse import reused
from reflact.running.rundir import RunDir, fingerprint

log = logging.getLogger("reflact")


class Settled:
    """The minibatches settled so far, and the window of prompts held (ready or in flight)."""

    def __init__(self, publish: Publisher, size: int) -> None:
        self.publish = publish
        self.window = threading.BoundedSemaphore(size)
        self.outcomes: dict[str, Outcome] = {}
        self.patches: dict[str, dict] = {}
        self.crashed: list[BaseException] = []

    def ended(self, outcome: Outcome, patch: dict | None) -> None:
        self.outcomes[outcome.tag] = outcome  # one key per minibatch: no lock needed
        if patch is not None:
            self.patches[outcome.tag] = patch
        self.publish(MinibatchEnded(outcome, patch))

    def finished(self, future) -> None:
        """A worker's minibatch settled (or was cancelled on a stop, or raised: a bug)."""
        try:
            if future.cancelled():
                return
            if future.exception() is not None:
                self.crashed.append(future.exception())
                return
            self.ended(*future.result())
        finally:
            self.window.release()


@dataclass
class Ready:
    """A minibatch whose prompt is built and written, waiting for a free worker."""

    mb: Minibatch
    outcome: Outcome
    prompt: Prompt
    fingerprint: str


@dataclass(frozen=True)
class StageSettings:
    """The sections the stage reads: what a minibatch is and its reply may hold (reflect), the
    templates (prompts), the call's shape, room and cap (optimizer)."""

    reflect: ReflectConfig
    prompts: PromptsConfig
    optimizer: OptimizerConfig


class Stage:
    """One run of the reflect stage over a dataset, writing into `run_dir`."""

    def __init__(
        self,
        settings: StageSettings,
        dataset: Dataset,
        optimizer: Optimizer,
        run_dir: Path,
        observers: list[Observer] | None = None,
        signals: StopSignal | None = None,
    ) -> None:
        self.settings = settings
        r, o = settings.reflect, settings.optimizer
        self.shape = shape(r, o)  # what each fingerprint holds besides the messages
        self.signals = signals if signals is not None else StopSignal()  # Ctrl-C and SIGTERM, noted
        self.dataset = dataset
        self.run_dir = RunDir(run_dir)
        self.mode: Mode = get_mode(r.update_mode)
        # resolved before any call, so a bad override path stops the run with nothing spent
        self.system: SystemPrompts = resolve_system_prompts(overrides_of(settings.prompts), self.mode, r)
        step_buffer, meta_skill = (
            text_or_file(getattr(r, key), f"reflect.{key}") or "" for key in ("step_buffer", "meta_skill")
        )
        self.prompts = PromptBuilder(
            dataset=dataset,
            mode=self.mode,
            system=self.system,
            budget=r.edit_budget,
            window=o.context_window,
            overflow=o.context_overflow,
            allowance=output_allowance(o, self.mode),
            step_buffer=step_buffer,
            meta_skill=meta_skill,
        )
        self.publish = Publisher(observers if observers is not None else [Progress(r, o, self.mode)])
        self.asker = make_asker(r, o, self.mode, self.system, optimizer, self.publish, self.signals.stopping())
        self._built: tuple[tuple[str, int], Prompt] | None = None  # the last minibatch's prompt, for its draws
        self.patches: dict[str, dict] = {}  # after run(): every minibatch's patch as saved, in plan order

    def observe(self, observer: Observer) -> None:
        self.publish.observers.append(observer)

    def run(self) -> list[Outcome]:
        """Every minibatch's outcome, failures by index then successes, whatever order they ended in."""
        plan = with_draws(plan_minibatches(self.dataset.results, self.settings.reflect), self.draws())
        self.publish(Planned(plan))
        self.run_dir.clean()
        settled = Settled(self.publish, 2 * self.settings.reflect.workers)
        with ThreadPoolExecutor(max_workers=self.settings.reflect.workers, thread_name_prefix="reflact-worker") as pool:
            try:
                futures: list[Future] = []
                for mb in plan:
                    settled.window.acquire()
                    self.signals.check()  # a signal whose exception was lost on the way stops here too
                    if settled.crashed:  # a bug in a worker: no new submission, reported as it is
                        raise settled.crashed[0]
                    ready = self.prepare(mb)
                    if isinstance(ready, Ready):
                        if not futures:  # the client first, alone on the GIL (Optimizer.ready)
                            self.asker.optimizer.ready()
                        futures.append(pool.submit(self.execute, ready))
                        futures[-1].add_done_callback(settled.finished)
                    else:
                        settled.ended(*ready)
                        settled.window.release()
                for future in futures:
                    future.result()  # a worker's exception surfaces here
                self.signals.check()
            except BaseException:  # Ctrl-C, SIGTERM, or a bug
                self.stop(pool)
                raise
        self.patches = {mb.tag: settled.patches[mb.tag] for mb in plan if mb.tag in settled.patches}
        return [settled.outcomes[mb.tag] for mb in plan]

    def draws(self) -> int:
        """optimizer.samples; several draws of one prompt only differ when the model samples."""
        o = self.settings.optimizer
        if o.samples > 1 and not o.temperature:
            log.warning(
                "optimizer.samples=%d with optimizer.temperature %s: a deterministic model gives every "
                "draw the same reply; set optimizer.temperature (e.g. 1.0)",
                o.samples,
                "unset" if o.temperature is None else "0",
            )
        return o.samples

    def stop(self, pool: ThreadPoolExecutor) -> None:
        """No new request starts; queued minibatches are dropped and requests in flight abandoned
        (their minibatches are recorded as failed, so a rerun of the run dir redoes them)."""
        self.asker.stopping.set()
        pool.shutdown(wait=False, cancel_futures=True)
        self.asker.optimizer.close()

    def prepare(self, mb: Minibatch, write: bool = True) -> Ready | tuple[Outcome, dict | None]:
        """The minibatch's prompt, written to its call dir (unless `write` is false: a batch's look
        ahead); or its final (outcome, patch) when it needs no call: nothing to show, or a saved
        patch made from the same prompt and settings."""
        outcome = Outcome(tag=mb.tag, group=mb.group, index=mb.index, ids=mb.ids)
        shown = [r for r in mb.results if r.id not in self.dataset.skipped]
        outcome.skipped, outcome.analysed = len(mb.results) - len(shown), len(shown)
        if not shown:
            outcome.status = "skipped"
            return outcome, None
        prompt = self._prompt(mb, shown)
        outcome.parts, outcome.shortened = len(prompt.parts), prompt.shortened
        fp = fingerprint(self.shape, prompt.messages, mb.draw, self.dataset.selection)
        saved = reused(self.run_dir, outcome, fp, self.mode.payload_key)
        if saved is not None:
            return outcome, saved
        if write:
            self.run_dir.write_prompt(mb.tag, prompt.parts)
        return Ready(mb, outcome, prompt, fp)

    def _prompt(self, mb: Minibatch, shown: list) -> Prompt:
        """The minibatch's prompt; its further draws (next in the plan, prepared on this one thread)
        take the one built for its first draw."""
        if mb.draw and self._built is not None and self._built[0] == (mb.group, mb.index):
            return self._built[1]
        prompt = self.prompts.build(mb.tag, mb.group, shown)
        self._built = ((mb.group, mb.index), prompt)
        return prompt

    def execute(self, ready: Ready) -> tuple[Outcome, dict | None]:
        """The conversation(s) of a prepared minibatch, then its record and patch."""
        outcome, tally, asked = ready.outcome, Tally(), []
        sample = self.settings.optimizer.sample + ready.mb.draw if self.settings.optimizer.samples > 1 else None
        for part, ids in zip(ready.prompt.parts, ready.prompt.ids, strict=True):
            one = self.asker.ask(
                outcome.tag, outcome.group, part, len(tally.call_log), self._keep(outcome.tag), ids, sample
            )
            tally.add(one.tally)
            asked.append(one)
            if one.status not in ("ok", "dry_run"):  # a dry run estimates every part
                break
        outcome.count(tally)
        last = asked[-1]
        outcome.parse, outcome.error = last.parse, last.error
        if last.status != "ok":
            outcome.status = last.status
            self.run_dir.write_outcome(outcome)
            return outcome, None
        patch = patch_file(ready, [a.checked for a in asked], self.mode, self.settings.reflect.edit_budget)
        return outcome, self.run_dir.save_patch(outcome, patch)

    def _keep(self, tag: str):
        return lambda number, reply: self.run_dir.write_reply(tag, number, reply.text)


def make_asker(
    reflect: ReflectConfig,
    o: OptimizerConfig,
    mode: Mode,
    system: SystemPrompts,
    optimizer: Optimizer,
    publish: Publisher,
    stopping: threading.Event,
) -> Asker:
    """The settings every conversation of the run shares."""
    provenance = reflect.provenance
    schemas = {group.name: reply_schema(mode, group, system.notes_allowed[group.name], provenance) for group in GROUPS}
    return Asker(
        optimizer=optimizer,
        mode=mode,
        budget=reflect.edit_budget,
        max_reasks=reflect.max_reasks,
        allowance=output_allowance(o, mode),
        ceiling=o.max_output_tokens_ceiling,
        price=o.prices.get(o.model),
        worst_price=cap_price(o),
        spend=Spend(o.max_cost_usd),
        schemas=schemas,
        notes_allowed=system.notes_allowed,
        publish=publish,
        stopping=stopping,
        provenance=provenance,
    )


def patch_file(ready: Ready, checked: list, mode: Mode, budget: int) -> dict:
    """The patch file: the model's object (parts merged), plus what reflact knows of it."""
    outcome = ready.outcome
    merged = checked[0] if len(checked) == 1 else merge_replies(checked, mode, budget)
    outcome.proposed, outcome.kept = merged.proposed, merged.kept
    obj = dict(merged.obj)
    # notes the model did not send come after source_type, as SkillOpt's reflect assigns them
    late = {} if merged.notes_sent or "appendix_notes" not in obj else {"appendix_notes": obj.pop("appendix_notes")}
    return {
        **obj,
        "source_type": outcome.group,
        **late,
        "batch_size": outcome.analysed,  # the patch's support, as SkillOpt's trainer reads it
        "trajectory_ids": outcome.ids,
        "n_analysed": outcome.analysed,
        "n_proposed": merged.proposed,
        "fingerprint": ready.fingerprint,
    }
