"""The two messages of one optimizer call (SPEC 3): resolving templates, building the user message."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from reflact.config import AppendixSource, PromptsConfig, ReflectConfig
from reflact.core.errors import UserError
from reflact.core.groups import FAILURE, GROUPS, SUCCESS, named
from reflact.core.modes import Mode
from reflact.core.shipped import prompts_dir
from reflact.inputs.render import BLOCK_DIVIDER

PROMPTS_DIR = prompts_dir()
_PATH_SUFFIXES = (".md", ".markdown", ".txt", ".text", ".rst")
PROVENANCE_TEMPLATE = "provenance"  # appended to both templates with reflect.provenance


@dataclass(frozen=True)
class SystemPrompts:
    failure: str
    success: str
    notes_allowed: dict[str, bool]  # group -> may the reply carry appendix_notes

    def text(self, group: str) -> str:
        return self.failure if group == FAILURE.name else self.success

    def hashes(self) -> dict[str, str]:
        return {group.name: content_hash(self.text(group.name)) for group in GROUPS}


def overrides_of(prompts: PromptsConfig) -> dict[str, str | None]:
    """Each group's replacement of its template (text or a file path), None where there is none."""
    return {group.name: getattr(prompts, group.prompt_key) for group in GROUPS}


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def text_or_file(value: str | None, key: str) -> str | None:
    """A config value that is either inline text or a path to a text file.

    A single line is a path when it names an existing file or directory, or looks like a path:
    it ends in a text suffix (.md, .txt...), starts with /, ~, ./ or ../, or holds a / and no
    whitespace. A path must be a readable UTF-8 regular file, else the error names the key (a
    mistyped path must not be sent as the prompt). Anything else, a sentence or several lines,
    is the text itself.
    """
    if value is None:
        return None
    candidate = value.strip()
    if not candidate or len(candidate.splitlines()) > 1:
        return value
    try:
        path = Path(candidate).expanduser()
        kind = "file" if path.is_file() else "dir" if path.is_dir() else "other" if path.exists() else None
    except (OSError, ValueError, RuntimeError):  # too long for a file name, a NUL byte, ~user of no user: no file
        kind = None
    if kind == "file":
        return _read_text_file(path, key)
    if kind == "dir":
        raise UserError(f"{key}: {_shown(candidate)} is a directory, not a text file")
    if kind == "other":
        raise UserError(f"{key}: {_shown(candidate)} is not a regular file")
    if _looks_like_path(candidate):
        raise UserError(f"{key}: no such file: {_shown(candidate)}")
    return value


def _looks_like_path(text: str) -> bool:
    separators = {"/", os.sep}
    if text.lower().endswith(_PATH_SUFFIXES) or text.startswith(("/", "~", "./", "../")):
        return True
    # a sentence may hold a slash ("refund/exchange"); a path without whitespace is one word
    return any(sep in text for sep in separators) and not any(ch.isspace() for ch in text)


def _read_text_file(path: Path, key: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{key}: {path} is not UTF-8 text") from None
    except OSError as exc:
        raise UserError(f"{key}: cannot read {path}: {exc.strerror or exc}") from None


def _shown(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def load_template(name: str, prompts_dir: Path = PROMPTS_DIR) -> str | None:
    path = prompts_dir / f"{name}.md"
    return path.read_text(encoding="utf-8") if path.is_file() else None


def _required(text: str | None, key: str, name: str, prompts_dir: Path) -> str:
    """A template the prompt cannot go without."""
    if text is None:
        raise UserError(f"{key}: no template {name}.md in {prompts_dir}")
    return text


def resolve_system_prompts(
    overrides: dict[str, str | None], mode: Mode, reflect: ReflectConfig, prompts_dir: Path = PROMPTS_DIR
) -> SystemPrompts:
    """Override > the mode's own template > the group's base template; then the skill-aware and the
    provenance additions (each only when its option is on: off, the text is the plain template)."""
    skill_aware = reflect.skill_aware.enabled and not mode.full_rewrite
    notes_allowed = {
        FAILURE.name: skill_aware,
        SUCCESS.name: skill_aware and reflect.skill_aware.appendix_source is AppendixSource.both,
    }
    texts = {}
    for group in GROUPS:
        key, base = group.config_key, group.template
        text = text_or_file(overrides.get(group.name), key)
        if text is None:
            text = load_template(base + mode.template_suffix, prompts_dir) or load_template(base, prompts_dir)
        if text is None:
            raise UserError(f"{key}: no template {base}.md in {prompts_dir}")
        if notes_allowed[group.name]:
            name = group.skill_aware_template
            addition = _required(load_template(name, prompts_dir), key, name, prompts_dir)
            text = f"{text.rstrip()}\n\n{addition.strip()}\n"
        if reflect.provenance:  # the shipped text when a prompts folder of one's own lacks it
            found = load_template(PROVENANCE_TEMPLATE, prompts_dir) or load_template(PROVENANCE_TEMPLATE)
            addition = _required(found, key, PROVENANCE_TEMPLATE, PROMPTS_DIR)
            text = f"{text.rstrip()}\n\n{addition.strip()}\n"
        texts[group.name] = text
    return SystemPrompts(failure=texts[FAILURE.name], success=texts[SUCCESS.name], notes_allowed=notes_allowed)


def budget_section(mode: Mode, budget: int) -> str:
    if mode.full_rewrite:
        return (
            f"## {mode.budget_heading}\n"
            "Produce exactly one complete replacement skill candidate for this minibatch. "
            "Do not output edits, patches or revise suggestions."
        )
    if budget < 0:
        line = f"There is no fixed limit on the number of {mode.label}; propose as many as the evidence supports."
    elif budget == 0:
        # L = 0 keeps no item (SPEC 2.6): ask for the analysis alone rather than for work thrown away
        line = (
            f"The budget is L=0: propose no {mode.label} and leave 'patch.{mode.payload_key}' empty; "
            "the rest of the reply, your analysis of the trajectories, is still wanted."
        )
    else:
        line = f"Produce at most L={budget} {mode.label}."
    return f"## {mode.budget_heading}\n{line}"


def meta_skill_section(meta_skill: str) -> str:
    return (
        "## Optimizer Meta Skill\n"
        "Lessons about optimizing this skill, learned in earlier epochs. Prefer them only when "
        "the evidence in this minibatch is ambiguous; the trajectories below take precedence.\n\n"
        f"{meta_skill.strip()}"
    )


def user_message(
    skill: str, mode: Mode, budget: int, group: str, blocks: list[str], step_buffer: str = "", meta_skill: str = ""
) -> str:
    sections = [f"## Current Skill\n{skill}", budget_section(mode, budget)]
    if step_buffer.strip():
        sections.append(f"## Previous Steps in This Epoch\n{step_buffer.strip()}")
    if meta_skill.strip():
        sections.append(meta_skill_section(meta_skill))
    sections.append(f"## {named(group).heading} ({len(blocks)} total)\n\n" + BLOCK_DIVIDER.join(blocks))
    return "\n\n".join(sections)
