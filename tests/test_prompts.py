"""The two messages of one call (SPEC 3): reflact.prompting.prompts."""

from __future__ import annotations

import re

import pytest

from reflact.core.errors import UserError
from reflact.core.modes import get_mode
from reflact.prompting.prompts import PROMPTS_DIR, resolve_system_prompts, text_or_file, user_message
from tests.conftest import make_config

PATCH = get_mode("patch")
REWRITE = get_mode("rewrite")
FULL = get_mode("full_rewrite")
NO_OVERRIDES = {"failure": None, "success": None}
SKILL_AWARE_HEADING = "## Skill-Aware Reflection"


@pytest.fixture
def reflect_cfg(tmp_path):
    """make_config(...).reflect with a dataset folder that exists."""
    data = tmp_path / "data"
    data.mkdir()

    def build(*overrides: str):
        return make_config(f"data.dir={data}", *overrides).reflect

    return build


def template(name: str) -> str:
    return (PROMPTS_DIR / f"{name}.md").read_text(encoding="utf-8")


# ---------------------------------------------------------------- resolution order


@pytest.mark.parametrize("mode,failure,success", [
    (PATCH, "analyst_error", "analyst_success"),
    (REWRITE, "analyst_error_rewrite", "analyst_success_rewrite"),
    (FULL, "analyst_error_full_rewrite", "analyst_success_full_rewrite"),
])
def test_mode_uses_its_own_template_byte_identical_when_skill_aware_off(reflect_cfg, mode, failure, success):
    prompts = resolve_system_prompts(NO_OVERRIDES, mode, reflect_cfg())
    assert prompts.failure == template(failure)
    assert prompts.success == template(success)
    assert prompts.notes_allowed == {"failure": False, "success": False}


def test_mode_templates_differ_from_the_base_ones():
    # otherwise the test above could not tell the mode's template from the base template
    assert template("analyst_error_rewrite") != template("analyst_error")
    assert template("analyst_success_full_rewrite") != template("analyst_success")


def test_inline_override_wins(reflect_cfg):
    overrides = {"failure": "You analyse failures.\nBe brief.", "success": "You analyse successes."}
    prompts = resolve_system_prompts(overrides, REWRITE, reflect_cfg())
    assert prompts.failure == "You analyse failures.\nBe brief."
    assert prompts.success == "You analyse successes."


def test_override_for_one_group_leaves_the_other_on_its_template(reflect_cfg):
    prompts = resolve_system_prompts({"failure": "Only failures.", "success": None}, PATCH, reflect_cfg())
    assert prompts.failure == "Only failures."
    assert prompts.success == template("analyst_success")


def test_override_path_to_a_md_file_is_read(reflect_cfg, tmp_path):
    path = tmp_path / "my_error.md"
    path.write_text("# My failure analyst\nRead carefully.\n", encoding="utf-8")
    prompts = resolve_system_prompts({"failure": str(path), "success": None}, PATCH, reflect_cfg())
    assert prompts.failure == "# My failure analyst\nRead carefully.\n"


def test_missing_override_md_path_names_the_key(reflect_cfg, tmp_path):
    missing = tmp_path / "nope" / "error.md"
    with pytest.raises(UserError, match=r"prompts\.error") as info:
        resolve_system_prompts({"failure": str(missing), "success": None}, PATCH, reflect_cfg())
    assert str(missing) in str(info.value)


def test_missing_success_override_path_names_its_key(reflect_cfg, tmp_path):
    with pytest.raises(UserError, match=r"prompts\.success"):
        resolve_system_prompts({"failure": None, "success": str(tmp_path / "s.md")}, PATCH, reflect_cfg())


def test_mode_template_missing_falls_back_to_the_base_template(reflect_cfg, tmp_path):
    prompts_dir = tmp_path / "prompts"
    prompts_dir.mkdir()
    (prompts_dir / "analyst_error.md").write_text("BASE ERROR\n", encoding="utf-8")
    (prompts_dir / "analyst_success.md").write_text("BASE SUCCESS\n", encoding="utf-8")
    (prompts_dir / "analyst_success_rewrite.md").write_text("REWRITE SUCCESS\n", encoding="utf-8")
    prompts = resolve_system_prompts(NO_OVERRIDES, REWRITE, reflect_cfg(), prompts_dir)
    assert prompts.failure == "BASE ERROR\n"
    assert prompts.success == "REWRITE SUCCESS\n"


def test_no_template_at_all_is_a_user_error(reflect_cfg, tmp_path):
    with pytest.raises(UserError, match="analyst_error"):
        resolve_system_prompts(NO_OVERRIDES, PATCH, reflect_cfg(), tmp_path)


# ---------------------------------------------------------------- skill-aware reflection


def test_skill_aware_adds_the_section_to_both_templates_by_default(reflect_cfg):
    prompts = resolve_system_prompts(NO_OVERRIDES, PATCH, reflect_cfg("reflect.skill_aware.enabled=true"))
    assert prompts.failure.startswith(template("analyst_error").rstrip())
    assert SKILL_AWARE_HEADING in prompts.failure and "EXECUTION_LAPSE" in prompts.failure
    assert SKILL_AWARE_HEADING not in template("analyst_error")
    assert template("skill_aware_error").strip() in prompts.failure
    assert template("skill_aware_success").strip() in prompts.success
    assert prompts.notes_allowed == {"failure": True, "success": True}


def test_skill_aware_failure_only_leaves_the_success_prompt_plain(reflect_cfg):
    cfg = reflect_cfg("reflect.skill_aware.enabled=true", "reflect.skill_aware.appendix_source=failure_only")
    prompts = resolve_system_prompts(NO_OVERRIDES, PATCH, cfg)
    assert SKILL_AWARE_HEADING in prompts.failure
    assert prompts.success == template("analyst_success")
    assert prompts.notes_allowed == {"failure": True, "success": False}


def test_skill_aware_applies_to_the_rewrite_templates_too(reflect_cfg):
    prompts = resolve_system_prompts(NO_OVERRIDES, REWRITE, reflect_cfg("reflect.skill_aware.enabled=true"))
    assert prompts.failure.startswith(template("analyst_error_rewrite").rstrip())
    assert SKILL_AWARE_HEADING in prompts.failure


def test_skill_aware_is_never_added_in_full_rewrite_mode(reflect_cfg):
    prompts = resolve_system_prompts(NO_OVERRIDES, FULL, reflect_cfg("reflect.skill_aware.enabled=true"))
    assert prompts.failure == template("analyst_error_full_rewrite")
    assert prompts.success == template("analyst_success_full_rewrite")
    assert prompts.notes_allowed == {"failure": False, "success": False}


def test_skill_aware_off_keeps_an_override_byte_identical(reflect_cfg):
    prompts = resolve_system_prompts({"failure": "X  \n\n", "success": None}, PATCH, reflect_cfg())
    assert prompts.failure == "X  \n\n"


def test_prompt_hashes_change_with_the_text(reflect_cfg):
    plain = resolve_system_prompts(NO_OVERRIDES, PATCH, reflect_cfg())
    aware = resolve_system_prompts(NO_OVERRIDES, PATCH, reflect_cfg("reflect.skill_aware.enabled=true"))
    assert plain.hashes()["failure"] != aware.hashes()["failure"]
    assert plain.hashes() == resolve_system_prompts(NO_OVERRIDES, PATCH, reflect_cfg()).hashes()


# ---------------------------------------------------------------- the user message

SKILL = "Always look up the order first.\n"
BLOCKS = ["### Trajectory 1 of 2 (id: a)\nbody a", "### Trajectory 2 of 2 (id: b)\nbody b"]


def section_order(text: str) -> list[str]:
    return re.findall(r"^## .*$", text, flags=re.M)


def test_user_message_order_with_every_section():
    text = user_message(SKILL, PATCH, 3, "failure", BLOCKS, step_buffer="Step 1 tried X: rejected.",
                        meta_skill="Prefer small edits.")
    assert section_order(text) == ["## Current Skill", "## Edit Budget", "## Previous Steps in This Epoch",
                                   "## Optimizer Meta Skill", "## Failed Trajectories (2 total)"]
    assert text.startswith(f"## Current Skill\n{SKILL}")
    assert "Step 1 tried X: rejected." in text.split("## Optimizer Meta Skill")[0].split("## Previous Steps")[1]
    meta = text.split("## Optimizer Meta Skill")[1].split("## Failed Trajectories")[0]
    assert "Prefer small edits." in meta
    assert re.search(r"[Pp]refer .* only when .* ambiguous", meta)
    trajectories = text.split("## Failed Trajectories (2 total)")[1]
    assert trajectories.index("(id: a)") < trajectories.index("(id: b)")
    assert re.search(r"^---$", trajectories, flags=re.M)


def test_budget_line_for_patch_mode():
    text = user_message(SKILL, PATCH, 3, "failure", BLOCKS)
    assert "at most L=3 edits" in text


def test_budget_line_for_rewrite_mode():
    text = user_message(SKILL, REWRITE, 3, "failure", BLOCKS)
    assert "at most L=3 revise suggestions" in text


def test_budget_line_without_limit():
    text = user_message(SKILL, PATCH, -1, "failure", BLOCKS)
    assert "at most" not in text and "no fixed limit" in text


@pytest.mark.parametrize("mode,budget,line", [
    (PATCH, -1, "There is no fixed limit on the number of edits; propose as many as the evidence supports."),
    (REWRITE, -5, "There is no fixed limit on the number of revise suggestions; propose as many as the evidence "
                  "supports."),
    (PATCH, 0, "The budget is L=0: propose no edits and leave 'patch.edits' empty; the rest of the reply, your "
               "analysis of the trajectories, is still wanted."),
    (REWRITE, 0, "The budget is L=0: propose no revise suggestions and leave 'patch.revise_suggestions' empty; "
                 "the rest of the reply, your analysis of the trajectories, is still wanted."),
    (PATCH, 1, "Produce at most L=1 edits."),
    (PATCH, 4, "Produce at most L=4 edits."),
    (REWRITE, 4, "Produce at most L=4 revise suggestions."),
], ids=["patch L<0", "rewrite L<0", "patch L=0", "rewrite L=0", "patch L=1", "patch L=4", "rewrite L=4"])
def test_budget_line_reads_as_a_sentence_for_every_l(mode, budget, line):
    heading = "## Edit Budget" if mode is PATCH else "## Suggestion Budget"
    assert f"\n\n{heading}\n{line}\n\n" in user_message(SKILL, mode, budget, "failure", BLOCKS)


@pytest.mark.parametrize("budget", [-1, 0])
def test_budget_line_never_says_produce_no_limit_or_a_limit_of_zero(budget):
    text = user_message(SKILL, PATCH, budget, "failure", BLOCKS)
    assert "Produce no" not in text and "at most L=0" not in text


def test_full_rewrite_asks_for_exactly_one_replacement_not_a_budget():
    text = user_message(SKILL, FULL, 3, "failure", BLOCKS)
    assert "exactly one complete replacement" in text
    assert "L=3" not in text and "at most" not in text


def test_empty_step_buffer_and_meta_skill_omit_their_sections():
    text = user_message(SKILL, PATCH, 3, "success", BLOCKS, step_buffer="  \n", meta_skill="")
    assert section_order(text) == ["## Current Skill", "## Edit Budget", "## Successful Trajectories (2 total)"]
    assert "Meta Skill" not in text and "Previous Steps" not in text


def test_success_heading_counts_the_blocks():
    text = user_message(SKILL, PATCH, 3, "success", BLOCKS[:1])
    assert "## Successful Trajectories (1 total)" in text


# ---------------------------------------------------------------- text_or_file


def test_text_or_file_reads_an_existing_path(tmp_path):
    path = tmp_path / "buffer.txt"
    path.write_text("from the file\n", encoding="utf-8")
    assert text_or_file(str(path), "reflect.step_buffer") == "from the file\n"


def test_text_or_file_reads_an_existing_path_without_suffix(tmp_path):
    path = tmp_path / "notes"
    path.write_text("plain file", encoding="utf-8")
    assert text_or_file(str(path), "reflect.meta_skill") == "plain file"


@pytest.mark.parametrize("value", ["Prefer small edits.", "two lines\nsee notes.md", "", None])
def test_text_or_file_keeps_inline_text(value):
    assert text_or_file(value, "reflect.meta_skill") == value


@pytest.mark.parametrize("name", ["missing.md", "missing.txt"])
def test_text_or_file_missing_path_names_the_key(tmp_path, name):
    with pytest.raises(UserError, match=r"reflect\.step_buffer"):
        text_or_file(str(tmp_path / name), "reflect.step_buffer")


def test_text_or_file_non_utf8_file_is_a_user_error(tmp_path):
    path = tmp_path / "bad.md"
    path.write_bytes(b"\xff\xfe bad")
    with pytest.raises(UserError, match=r"prompts\.error"):
        text_or_file(str(path), "prompts.error")



@pytest.mark.parametrize("value", ["notes.md", "~draft", "NOTES.TXT", "~no-such-user-here/notes.md"])
def test_a_missing_file_named_without_a_slash_is_still_a_path(value):
    with pytest.raises(UserError, match=r"reflect\.meta_skill: no such file"):
        text_or_file(value, "reflect.meta_skill")
