"""The three update modes: their names and aliases, payload keys and item schemas (SPEC 4)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from reflact.core.errors import UserError
from reflact.core.groups import FAILURE, Group

EDIT_OPS = ("append", "insert_after", "replace", "delete")
NEEDS_TARGET = ("insert_after", "replace", "delete")  # ops that find a target in the skill
NEEDS_CONTENT = ("append", "insert_after", "replace")  # ops that write text


class Edit(BaseModel):
    model_config = ConfigDict(extra="allow")

    op: Literal[EDIT_OPS]  # type: ignore[valid-type]  # the tuple subscripts as its members (pydantic reads them)
    target: str | None = None
    content: str | None = None

    @model_validator(mode="after")
    def _fields_for_op(self) -> Edit:
        if self.op in NEEDS_TARGET and not self.target:
            raise ValueError(f"op '{self.op}' needs a non-empty 'target'")
        if self.op in NEEDS_CONTENT and self.content is None:
            raise ValueError(f"op '{self.op}' needs 'content'")
        return self


class Suggestion(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["add_rule", "remove_rule", "merge_rules", "reorganize", "compress", "clarify"]
    title: str
    motivation: str
    instruction: str
    priority_hint: Literal["high", "medium", "low"]


class SkillCandidate(BaseModel):
    model_config = ConfigDict(extra="allow")

    title: str
    change_summary: list[str]
    new_skill: str = Field(min_length=1)


@dataclass(frozen=True)
class Mode:
    name: str
    payload_key: str
    item: type[BaseModel]
    label: str  # what the budget line counts, plural
    budget_heading: str
    template_suffix: str  # appended to the group's template name in prompts/
    number: int  # the mode as a metric, so charts can use it; fixed: logged runs keep their meaning
    short: str  # in run names, prompt names and reports: patch, rewrite, full_rewrite
    full_rewrite: bool = False


MODES = {
    "patch": Mode("patch", "edits", Edit, "edits", "Edit Budget", "", number=0, short="patch"),
    "rewrite_from_suggestions": Mode(
        "rewrite_from_suggestions",
        "revise_suggestions",
        Suggestion,
        "revise suggestions",
        "Suggestion Budget",
        "_rewrite",
        number=1,
        short="rewrite",
    ),
    "full_rewrite_minibatch": Mode(
        "full_rewrite_minibatch",
        "skill_candidates",
        SkillCandidate,
        "skill candidates",
        "Update Format",
        "_full_rewrite",
        number=2,
        short="full_rewrite",
        full_rewrite=True,
    ),
}

ALIASES = {
    "edits": "patch",
    "rewrite": "rewrite_from_suggestions",
    "suggestions": "rewrite_from_suggestions",
    "rewrite_suggestions": "rewrite_from_suggestions",
    "full_rewrite": "full_rewrite_minibatch",
    "minibatch_full_rewrite": "full_rewrite_minibatch",
    "skill_rewrite_minibatch": "full_rewrite_minibatch",
}


def normalize_mode(name: str) -> str:
    key = str(name).strip().lower()
    key = ALIASES.get(key, key)
    if key not in MODES:
        known = ", ".join(sorted([*MODES, *ALIASES]))
        raise UserError(f"reflect.update_mode: unknown mode {name!r} (known: {known})")
    return key


def get_mode(name: str) -> Mode:
    return MODES[normalize_mode(name)]


def mode_by_number(number: int) -> Mode:
    return next(mode for mode in MODES.values() if mode.number == number)


# one failure pattern, in the shape SkillOpt's trainer reads (failure_type, count, description)
FAILURE_PATTERN = {
    "type": "object",
    "properties": {
        "failure_type": {"type": "string"},
        "count": {"type": "integer"},
        "trajectories": {"type": "array", "items": {"type": "string"}},
        "description": {"type": "string"},
    },
    "required": ["failure_type", "count", "description"],
}


# with reflect.provenance, each item names the trajectories (1-based positions) it stands on
SUPPORT_FIELD = "supporting_trajectories"
SUPPORT_IDS_FIELD = "supporting_ids"  # what reflact records: those positions as trajectory ids


def with_support(item: type[BaseModel]) -> type[BaseModel]:
    """The item model with the provenance field: a subclass, so the plain models (and the schema
    sent without provenance) stay exactly as they are."""
    positions = (
        list[Annotated[int, Field(ge=1)]],
        Field(description="the numbers i of the headings 'Trajectory i of N' this item stands on"),
    )
    # pydantic types the fields by keyword, not through a ** mapping
    return create_model(f"{item.__name__}WithSupport", __base__=item, **{SUPPORT_FIELD: positions})  # type: ignore[call-overload]


def reply_schema(mode: Mode, group: Group, notes_allowed: bool, provenance: bool = False) -> dict:
    """The JSON schema of a reply, sent as structured output where the server supports it."""
    summary_key = group.summary_key
    item = (with_support(mode.item) if provenance else mode.item).model_json_schema()
    item.pop("title", None)
    properties = {
        summary_key: {"type": "array", "items": FAILURE_PATTERN if group is FAILURE else {"type": "object"}},
        "patch": {
            "type": "object",
            "properties": {"reasoning": {"type": "string"}, mode.payload_key: {"type": "array", "items": item}},
            "required": ["reasoning", mode.payload_key],
        },
    }
    if notes_allowed:
        properties["appendix_notes"] = {"type": "array", "items": {"type": "string"}}
    return {"type": "object", "properties": properties, "required": [summary_key, "patch"]}
