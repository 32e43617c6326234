"""Which trajectories go to which call (SPEC 2, steps 2-4): pure functions, no I/O.

Failures and successes are shuffled apart, each with its own seed, then cut into minibatches
of at most M. The permutation never depends on M, so the minibatches for M=4 are halves of
those for M=8 and runs with different M compare on the same trajectories.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from reflact.config import ReflectConfig
from reflact.dataset import Result

GROUPS = ("failure", "success")
GROUP_TAG = {"failure": "fail", "success": "succ"}


@dataclass(frozen=True)
class Minibatch:
    group: str  # "failure" or "success"
    index: int  # position within its group
    results: list[Result]

    @property
    def tag(self) -> str:
        """The minibatch's name: its patch file and its call folder are named after it."""
        return f"minibatch_{GROUP_TAG[self.group]}_{self.index:03d}"

    @property
    def ids(self) -> list[str]:
        return [r.id for r in self.results]


def split(results: list[Result], threshold: float, failure_only: bool) -> tuple[list[Result], list[Result]]:
    """(failures, successes): a run below the threshold failed; successes are dropped with failure_only."""
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


def plan_minibatches(results: list[Result], reflect: ReflectConfig) -> list[Minibatch]:
    """Failures by index, then successes by index: the order patches are returned and logged in."""
    failures, successes = split(results, reflect.success_threshold, reflect.failure_only)
    seeds = {"failure": reflect.seed, "success": reflect.seed + 1}
    plan = []
    for group, members in zip(GROUPS, (failures, successes)):
        batches = chunks(shuffled(members, seeds[group]), reflect.minibatch_size)
        plan += [Minibatch(group, index, batch) for index, batch in enumerate(batches)]
    return plan
