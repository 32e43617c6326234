"""Which trajectories go to which call (SPEC 2, steps 2-4): pure functions, no I/O.

Failures and successes are shuffled apart, each with its own seed, then cut into minibatches
of at most M. The permutation never depends on M, so the minibatches for M=4 are halves of
those for M=8 and runs with different M compare on the same trajectories.

With `optimizer.samples=k` > 1 each minibatch is asked k times: its draws follow it in the plan,
each its own conversation with its own tag (draw 0 keeps the minibatch's name, draw d > 0 adds
`.d<d>`: `minibatch_fail_000`, `minibatch_fail_000.d1`, `minibatch_fail_000.d2`, ...).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, replace

from reflact.config import ReflectConfig
from reflact.core.groups import GROUPS, failed, named, tagged
from reflact.inputs.dataset import Result

_TAG = re.compile(r"minibatch_(fail|succ)_(\d{1,9})(?:\.d(\d{1,9}))?", re.ASCII)  # ASCII digits, an int() can read


@dataclass(frozen=True)
class Minibatch:
    group: str  # a group's name (reflact.core.groups)
    index: int  # position within its group
    results: list[Result]
    draw: int = 0  # which of the minibatch's `optimizer.samples` draws this conversation is

    @property
    def tag(self) -> str:
        """The minibatch's name: its patch file and its call folder are named after it."""
        return f"minibatch_{named(self.group).tag}_{self.index:03d}" + (f".d{self.draw}" if self.draw else "")

    @property
    def ids(self) -> list[str]:
        return [r.id for r in self.results]


def split(results: list[Result], threshold: float, failure_only: bool) -> tuple[list[Result], list[Result]]:
    """(failures, successes): a run below the threshold failed; successes are dropped with failure_only."""
    failures = [r for r in results if failed(r.hard, threshold)]
    successes = [] if failure_only else [r for r in results if not failed(r.hard, threshold)]
    return failures, successes


def shuffled(items: list, seed: int) -> list:
    """A permutation that depends on the seed only, never on M, so smaller M refines larger M."""
    order = list(items)
    random.Random(seed).shuffle(order)
    return order


def chunks(items: list, size: int) -> list[list]:
    return [items[start : start + size] for start in range(0, len(items), size)]


def plan_minibatches(results: list[Result], reflect: ReflectConfig) -> list[Minibatch]:
    """Failures by index, then successes by index: the order patches are returned and logged in."""
    failures, successes = split(results, reflect.success_threshold, reflect.failure_only)
    plan = []
    for group, members in zip(GROUPS, (failures, successes), strict=True):
        batches = chunks(shuffled(members, reflect.seed + group.seed_offset), reflect.minibatch_size)
        plan += [Minibatch(group.name, index, batch) for index, batch in enumerate(batches)]
    return plan


def with_draws(plan: list[Minibatch], samples: int) -> list[Minibatch]:
    """Each minibatch followed by its further draws (k = 1: the plan as it is)."""
    return [replace(mb, draw=draw) for mb in plan for draw in range(samples)]


def parse_tag(tag: str) -> tuple[str, int, int] | None:
    """(group, index, draw) of a minibatch tag; None for a name that is not one."""
    found = _TAG.fullmatch(tag)
    if found is None:
        return None
    return tagged(found.group(1)).name, int(found.group(2)), int(found.group(3) or 0)


def is_tag(name: object) -> bool:
    """Whether a name read back from a record is a minibatch's name exactly as the plan spells it.
    Files and folders are named after it, so anything else (`../x`, `/x`, `minibatch_fail_1`) is a
    damaged record, never a path."""
    where = parse_tag(name) if isinstance(name, str) else None
    return where is not None and Minibatch(where[0], where[1], [], where[2]).tag == name
