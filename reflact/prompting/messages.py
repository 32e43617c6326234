"""The messages of one minibatch's call(s): its trajectory blocks under the templates (SPEC 3),
fitted to `optimizer.context_window`.

A prompt that would not fit is split into halves, each its own call (their replies are merged
into one patch later); a single trajectory, a full rewrite or `context_overflow=shorten` has
its longest items shortened in the middle instead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from reflact.calls.protocol import estimate_tokens
from reflact.config import ContextOverflow
from reflact.core.modes import Mode
from reflact.inputs.dataset import Dataset, Result, Trajectory, load_trajectory
from reflact.inputs.render import render_block
from reflact.prompting.prompts import SystemPrompts, user_message

log = logging.getLogger("reflact")

SHORTEN_STEPS = (16000, 8000, 4000, 2000, 1000, 500, 200)  # characters per item, tried in turn
WINDOW_RESERVE = 0.9  # chars/4 is a rough count: keep a tenth of the window in reserve


@dataclass(frozen=True)
class Prompt:
    parts: list[list[dict]]  # the messages of each call (more than one when split to fit)
    shortened: int = 0  # when items were shortened to fit: their new length in characters
    ids: list[list[str]] = field(default_factory=list)  # the trajectories each part shows, in order

    @property
    def messages(self) -> list[dict]:
        """Every message of every part: what the fingerprint covers."""
        return [m for part in self.parts for m in part]


@dataclass(frozen=True, kw_only=True)
class PromptBuilder:
    """Builds the prompt of any minibatch of one run (templates and contexts resolved once)."""

    dataset: Dataset
    mode: Mode
    system: SystemPrompts
    budget: int  # reflect.edit_budget
    window: int | None  # optimizer.context_window
    overflow: ContextOverflow  # optimizer.context_overflow
    allowance: int  # the first request's output-token allowance
    step_buffer: str = ""
    meta_skill: str = ""

    def build(self, tag: str, group: str, shown: list[Result]) -> Prompt:
        """The prompt of the trajectories `shown` (each read from disk once, however it is fitted)."""
        return self._fitted(tag, group, shown, [load_trajectory(self.dataset, r) for r in shown])

    def _fitted(self, tag: str, group: str, shown: list[Result], loaded: list[Trajectory]) -> Prompt:
        messages = self.messages(group, shown, loaded)
        if self.fits(messages):
            return Prompt([messages], ids=[[r.id for r in shown]])
        if self.overflow is ContextOverflow.split and len(shown) > 1 and not self.mode.full_rewrite:
            half = (len(shown) + 1) // 2
            log.info(
                "%s: ~%d prompt tokens do not fit optimizer.context_window=%d; splitting %d trajectories into %d + %d",
                tag,
                estimate_tokens(messages),
                self.window,
                len(shown),
                half,
                len(shown) - half,
            )
            first = self._fitted(tag, group, shown[:half], loaded[:half])
            second = self._fitted(tag, group, shown[half:], loaded[half:])
            return Prompt(first.parts + second.parts, second.shortened or first.shortened, first.ids + second.ids)
        return self.shortened(tag, group, shown, loaded)

    def shortened(self, tag: str, group: str, shown: list[Result], loaded: list[Trajectory]) -> Prompt:
        """One call with the items cut to the longest length (of SHORTEN_STEPS) that fits."""
        for limit in SHORTEN_STEPS:
            messages = self.messages(group, shown, loaded, max_item_chars=limit)
            if self.fits(messages):
                log.info(
                    "%s: items shortened to %d characters to fit optimizer.context_window=%d (~%d prompt tokens)",
                    tag,
                    limit,
                    self.window,
                    estimate_tokens(messages),
                )
                return Prompt([messages], limit, [[r.id for r in shown]])
        log.warning(
            "%s: ~%d prompt tokens still exceed optimizer.context_window=%d with items shortened to %d "
            "characters (the skill and templates alone are too long?); calling anyway",
            tag,
            estimate_tokens(messages),
            self.window,
            limit,
        )
        return Prompt([messages], limit, [[r.id for r in shown]])

    def fits(self, messages: list[dict]) -> bool:
        return self.window is None or estimate_tokens(messages) + self.allowance <= WINDOW_RESERVE * self.window

    def messages(
        self, group: str, shown: list[Result], loaded: list[Trajectory], max_item_chars: int | None = None
    ) -> list[dict]:
        blocks = [
            render_block(position, len(shown), result.id, t.fields, t.extras, t.conversation, max_item_chars)
            for position, (result, t) in enumerate(zip(shown, loaded, strict=True), 1)
        ]
        system = self.system.text(group)
        user = user_message(
            self.dataset.skill, self.mode, self.budget, group, blocks, self.step_buffer, self.meta_skill
        )
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]
