"""The two groups a run's trajectories fall into, and every name each group carries (SPEC 2-4).

A run failed when its hard score is below `reflect.success_threshold`; `failed` is that rule's
one place. Each group is shuffled with its own seed, asked with its own template, answers under
its own summary key and can have its template replaced by its own config key. Plans, outcomes
and events name a group by its `name`; `named` turns the name back into the group.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Group:
    name: str  # in plans, outcomes, events and prompt names
    tag: str  # in minibatch names: minibatch_fail_000
    seed_offset: int  # added to reflect.seed for the group's shuffle
    template: str  # the analyst template in prompts/, before the mode's suffix
    skill_aware_template: str  # added to it with reflect.skill_aware
    heading: str  # above the trajectories in the user message
    summary_key: str  # the reply's list of patterns
    summary_title: str  # that list's heading in report.md
    prompt_key: str  # the `prompts` key whose text or file replaces the template

    @property
    def config_key(self) -> str:
        return f"prompts.{self.prompt_key}"


FAILURE = Group(
    name="failure",
    tag="fail",
    seed_offset=0,
    template="analyst_error",
    skill_aware_template="skill_aware_error",
    heading="Failed Trajectories",
    summary_key="failure_summary",
    summary_title="Failure summary",
    prompt_key="error",
)
SUCCESS = Group(
    name="success",
    tag="succ",
    seed_offset=1,
    template="analyst_success",
    skill_aware_template="skill_aware_success",
    heading="Successful Trajectories",
    summary_key="success_patterns",
    summary_title="Success patterns",
    prompt_key="success",
)
GROUPS = (FAILURE, SUCCESS)  # failures first: the order of the plan, the patches and the logs
_BY_NAME = {group.name: group for group in GROUPS}
_BY_TAG = {group.tag: group for group in GROUPS}


def named(name: str) -> Group:
    return _BY_NAME[name]


def tagged(tag: str) -> Group:
    return _BY_TAG[tag]


def failed(hard: float, threshold: float) -> bool:
    """The failure rule: a run whose hard score is below the threshold failed."""
    return hard < threshold
