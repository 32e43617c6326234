"""From a parsed reply to a patch (SPEC 4): reflact.replies.patches with the modes of reflact.core.modes."""

from __future__ import annotations

import pytest

from reflact.core.modes import get_mode
from reflact.replies.patches import ReplyError, check_reply, cut, normalize_notes

PATCH = get_mode("patch")
REWRITE = get_mode("rewrite")
FULL = get_mode("full_rewrite")


def edit(n: int) -> dict:
    return {"op": "append", "content": f"rule {n}"}


def suggestion(**overrides) -> dict:
    return {"type": "add_rule", "title": "t", "motivation": "m", "instruction": "i", "priority_hint": "high",
            **overrides}


def candidate(**overrides) -> dict:
    return {"title": "t", "change_summary": ["one"], "new_skill": "# New skill\n", **overrides}


def reply(key: str, items: list, **extra) -> dict:
    return {"failure_summary": [], "patch": {"reasoning": "because", key: items}, **extra}


def check(obj, mode=PATCH, group="failure", budget=4, notes_allowed=False):
    return check_reply(obj, mode, group, budget, notes_allowed)


# ---------------------------------------------------------------- the cut


@pytest.mark.parametrize("budget,expected", [(-1, 5), (-7, 5), (0, 0), (2, 2), (5, 5), (9, 5)])
def test_cut_keeps_first_l_items(budget, expected):
    items = list(range(5))
    assert cut(items, budget) == items[:expected]


def test_reply_cut_to_budget_keeps_the_first_items_and_counts_proposed_before_the_cut():
    checked = check(reply("edits", [edit(i) for i in range(5)]), budget=2)
    assert checked.obj["patch"]["edits"] == [edit(0), edit(1)]
    assert (checked.proposed, checked.kept) == (5, 2)


def test_reply_budget_zero_keeps_nothing():
    checked = check(reply("edits", [edit(i) for i in range(3)]), budget=0)
    assert checked.obj["patch"]["edits"] == []
    assert (checked.proposed, checked.kept) == (3, 0)


def test_reply_negative_budget_keeps_everything():
    checked = check(reply("edits", [edit(i) for i in range(6)]), budget=-1)
    assert (checked.proposed, checked.kept) == (6, 6)


def test_reply_keeps_the_other_keys_of_the_model_object():
    obj = reply("edits", [edit(0)], extra_key={"x": 1})
    obj["failure_summary"] = [{"pattern": "p", "seen": "twice"}]
    checked = check(obj)
    assert checked.obj["extra_key"] == {"x": 1}
    assert checked.obj["failure_summary"][0]["pattern"] == "p" and checked.obj["failure_summary"][0]["seen"] == "twice"
    assert checked.obj["patch"]["reasoning"] == "because"


@pytest.mark.parametrize("sent,expected", [
    # the fields SkillOpt's trainer reads, as the template asks for them: kept as they are
    ({"failure_type": "t", "count": 3, "description": "d"}, ("t", 3, "d")),
    # named otherwise: mapped; count from the trajectories named
    ({"pattern": "p", "trajectories": ["a", "b"], "root_cause": "rc", "evidence": "ev"}, ("p", 2, "rc ev")),
    ({"name": "n", "description": "d", "count": "many"}, ("n", 1, "d")),  # a count that is no count
    ({"failure_type": "t", "count": -2, "trajectories": ["a"]}, ("t", 1, "")),
    ({"failure_type": "t", "count": True}, ("t", 1, "")),
    ("a pattern as a sentence", ("a pattern as a sentence", 1, "")),
    ({}, ("", 1, "")),
])
def test_failure_patterns_carry_type_count_and_description(sent, expected):
    obj = reply("edits", [edit(0)])
    obj["failure_summary"] = [sent, 7, None]  # entries that are no pattern at all are dropped
    [entry] = check(obj).obj["failure_summary"]
    assert (entry["failure_type"], entry["count"], entry["description"]) == expected


def test_success_patterns_are_left_as_sent():
    obj = reply("edits", [edit(0)])
    obj["success_patterns"] = [{"pattern": "p"}]
    assert check(obj, group="success").obj["success_patterns"] == [{"pattern": "p"}]


def test_check_does_not_mutate_the_callers_object():
    obj = reply("edits", [edit(i) for i in range(3)])
    check(obj, budget=1)
    assert len(obj["patch"]["edits"]) == 3


# ---------------------------------------------------------------- item validation


def test_unknown_op_names_index_and_field():
    items = [edit(0), {"op": "rename", "target": "a", "content": "b"}]
    with pytest.raises(ReplyError, match=r"patch\.edits\[1\].*op"):
        check(reply("edits", items))


@pytest.mark.parametrize("op", ["insert_after", "replace", "delete"])
def test_op_needing_a_target_without_one_names_index_and_target(op):
    with pytest.raises(ReplyError, match=r"patch\.edits\[0\].*target"):
        check(reply("edits", [{"op": op, "content": "x"}]))


def test_empty_target_is_missing():
    with pytest.raises(ReplyError, match=r"patch\.edits\[0\].*target"):
        check(reply("edits", [{"op": "replace", "target": "", "content": "x"}]))


def test_append_without_content_names_index_and_content():
    with pytest.raises(ReplyError, match=r"patch\.edits\[2\].*content"):
        check(reply("edits", [edit(0), edit(1), {"op": "append"}]))


def test_delete_needs_no_content():
    checked = check(reply("edits", [{"op": "delete", "target": "old rule"}]))
    assert checked.kept == 1


def test_item_that_is_not_an_object_is_an_error():
    with pytest.raises(ReplyError, match=r"patch\.edits\[0\]"):
        check(reply("edits", ["append this"]))


def test_invalid_item_beyond_the_budget_does_not_matter():
    items = [edit(0), edit(1), {"op": "bogus"}]
    checked = check(reply("edits", items), budget=2)
    assert (checked.proposed, checked.kept) == (3, 2)


def test_invalid_item_within_the_budget_is_an_error():
    with pytest.raises(ReplyError):
        check(reply("edits", [edit(0), {"op": "bogus"}]), budget=2)


def test_payload_under_the_wrong_key_for_the_mode_is_an_error():
    with pytest.raises(ReplyError, match="revise_suggestions"):
        check(reply("edits", [edit(0)]), mode=REWRITE)


def test_non_string_reasoning_is_an_error():
    obj = {"patch": {"reasoning": ["a"], "edits": []}}
    with pytest.raises(ReplyError, match="reasoning"):
        check(obj)


# ---------------------------------------------------------------- rewrite suggestions


def test_valid_suggestions_are_cut_to_budget():
    checked = check(reply("revise_suggestions", [suggestion(title=str(i)) for i in range(4)]), mode=REWRITE,
                    budget=3)
    assert [s["title"] for s in checked.obj["patch"]["revise_suggestions"]] == ["0", "1", "2"]
    assert checked.proposed == 4


def test_suggestion_with_unknown_type_names_index_and_type():
    items = [suggestion(), suggestion(type="rewrite_everything")]
    with pytest.raises(ReplyError, match=r"patch\.revise_suggestions\[1\].*type"):
        check(reply("revise_suggestions", items), mode=REWRITE)


def test_suggestion_with_unknown_priority_names_priority_hint():
    with pytest.raises(ReplyError, match=r"patch\.revise_suggestions\[0\].*priority_hint"):
        check(reply("revise_suggestions", [suggestion(priority_hint="urgent")]), mode=REWRITE)


def test_suggestion_missing_a_field_names_it():
    item = suggestion()
    del item["instruction"]
    with pytest.raises(ReplyError, match=r"patch\.revise_suggestions\[0\].*instruction"):
        check(reply("revise_suggestions", [item]), mode=REWRITE)


# ---------------------------------------------------------------- full rewrite


@pytest.mark.parametrize("budget", [0, 1, -1])
def test_full_rewrite_keeps_its_one_candidate_whatever_the_budget(budget):
    checked = check(reply("skill_candidates", [candidate()]), mode=FULL, budget=budget)
    assert checked.obj["patch"]["skill_candidates"] == [candidate()]
    assert (checked.proposed, checked.kept) == (1, 1)


@pytest.mark.parametrize("count", [0, 2])
def test_full_rewrite_needs_exactly_one_candidate(count):
    with pytest.raises(ReplyError, match="exactly one"):
        check(reply("skill_candidates", [candidate() for _ in range(count)]), mode=FULL, budget=5)


def test_full_rewrite_candidate_needs_a_non_empty_new_skill():
    with pytest.raises(ReplyError, match="new_skill"):
        check(reply("skill_candidates", [candidate(new_skill="")]), mode=FULL)


def test_full_rewrite_change_summary_must_be_a_list_of_strings():
    with pytest.raises(ReplyError, match="change_summary"):
        check(reply("skill_candidates", [candidate(change_summary="did things")]), mode=FULL)


# ---------------------------------------------------------------- appendix notes


@pytest.mark.parametrize("raw,expected", [
    (None, []),
    ("  re-read the format rule  ", ["re-read the format rule"]),
    ("", []),
    (["a", "", "  ", "b"], ["a", "b"]),
    ([{"note": "n1"}, {"content": "c1"}, {"other": "x"}, {"note": ""}], ["n1", "c1"]),
    ({"note": "single object"}, ["single object"]),
    (["a", 3, None, ["nested"]], ["a"]),
    (7, []),
])
def test_notes_are_normalised_to_non_empty_strings(raw, expected):
    assert normalize_notes(raw) == expected


def test_notes_are_normalised_in_the_checked_reply():
    obj = reply("edits", [edit(0)], appendix_notes=["keep", "", {"note": "n"}])
    checked = check(obj, notes_allowed=True)
    assert checked.obj["appendix_notes"] == ["keep", "n"]


def test_failure_reply_with_notes_but_no_patch_is_an_empty_patch_carrying_the_notes():
    obj = {"failure_summary": [], "appendix_notes": ["follow the cents rule"]}
    checked = check(obj, notes_allowed=True)
    assert checked.obj["patch"]["edits"] == []
    assert checked.obj["appendix_notes"] == ["follow the cents rule"]
    assert (checked.proposed, checked.kept) == (0, 0)


def test_failure_reply_with_notes_and_payload_key_missing_uses_the_modes_key():
    obj = {"patch": {"reasoning": "lapses"}, "appendix_notes": "one note"}
    checked = check(obj, mode=REWRITE, notes_allowed=True)
    assert checked.obj["patch"]["revise_suggestions"] == []
    assert checked.obj["appendix_notes"] == ["one note"]


def test_notes_without_patch_are_an_error_when_notes_are_not_allowed():
    with pytest.raises(ReplyError, match="patch"):
        check({"appendix_notes": ["x"]}, notes_allowed=False)


def test_notes_without_patch_are_an_error_for_a_success_reply():
    with pytest.raises(ReplyError, match="patch"):
        check({"success_patterns": [], "appendix_notes": ["x"]}, group="success", notes_allowed=True)


def test_empty_notes_do_not_excuse_a_missing_patch():
    with pytest.raises(ReplyError):
        check({"appendix_notes": ["", "  "]}, notes_allowed=True)


def test_success_reply_without_patch_is_an_error():
    with pytest.raises(ReplyError, match="patch"):
        check({"success_patterns": ["p"]}, group="success")


# ---------------------------------------------------------------- notes are never lost to a wrong edit


def test_failure_reply_with_notes_and_an_invalid_kept_edit_keeps_the_notes_in_an_empty_patch():
    obj = reply("edits", [edit(0), {"op": "bogus"}], appendix_notes=["follow the cents rule", {"note": "n2"}])
    checked = check(obj, budget=2, notes_allowed=True)
    assert checked.obj["appendix_notes"] == ["follow the cents rule", "n2"]
    assert checked.obj["patch"]["edits"] == [] and (checked.proposed, checked.kept) == (0, 0)
    # why the edits were dropped is kept beside the model's reasoning, never in silence
    assert checked.obj["patch"]["reasoning"] == "because"
    assert checked.obj["patch"]["unusable"].startswith("patch.edits[1]: op")
    assert checked.obj["failure_summary"] == []


@pytest.mark.parametrize("patch", [
    {"reasoning": "r", "edits": ["append this"]},
    {"reasoning": "r", "edits": {"op": "append", "content": "x"}},
    {"reasoning": ["not", "a", "string"], "edits": [edit(0)]},
    "just prose",
    ["a", "list"],
], ids=["item not an object", "payload an object", "reasoning a list", "patch a string", "patch a list"])
def test_failure_reply_with_notes_and_any_unusable_patch_keeps_the_notes(patch):
    checked = check({"failure_summary": [], "patch": patch, "appendix_notes": ["n"]}, notes_allowed=True)
    assert checked.obj["appendix_notes"] == ["n"] and checked.obj["patch"]["edits"] == []
    assert checked.obj["patch"]["unusable"] and isinstance(checked.obj["patch"]["reasoning"], str)


def test_notes_only_patch_keeps_the_modes_payload_key():
    obj = reply("revise_suggestions", [suggestion(priority_hint="urgent")], appendix_notes="a note")
    checked = check(obj, mode=REWRITE, notes_allowed=True)
    assert checked.obj["patch"]["revise_suggestions"] == [] and checked.obj["appendix_notes"] == ["a note"]


def test_lapse_only_reply_records_no_unusable_patch():
    checked = check({"failure_summary": [], "appendix_notes": ["n"]}, notes_allowed=True)
    assert checked.obj["patch"] == {"reasoning": "execution lapses only", "edits": []}


def test_an_invalid_edit_is_still_asked_again_without_notes_or_in_a_success_reply():
    invalid = [edit(0), {"op": "bogus"}]
    with pytest.raises(ReplyError, match=r"patch\.edits\[1\]"):
        check(reply("edits", invalid, appendix_notes=["", " "]), notes_allowed=True)
    with pytest.raises(ReplyError, match=r"patch\.edits\[1\]"):
        check(reply("edits", invalid, appendix_notes=["n"]), notes_allowed=False)
    with pytest.raises(ReplyError, match=r"patch\.edits\[1\]"):
        check({"success_patterns": [], **reply("edits", invalid), "appendix_notes": ["n"]}, group="success",
              notes_allowed=True)


def test_a_valid_patch_with_notes_keeps_both():
    checked = check(reply("edits", [edit(0), edit(1)], appendix_notes=["n"]), budget=1, notes_allowed=True)
    assert checked.obj["patch"] == {"reasoning": "because", "edits": [edit(0)]}
    assert checked.obj["appendix_notes"] == ["n"] and (checked.proposed, checked.kept) == (2, 1)


def test_the_reask_error_is_the_validators_own_sentence():
    with pytest.raises(ReplyError) as raised:
        check(reply("edits", [edit(0), {"op": "replace", "content": "x"}]))
    assert str(raised.value) == "patch.edits[1]: op 'replace' needs a non-empty 'target'"
    with pytest.raises(ReplyError) as raised:
        check(reply("edits", [{"op": "rewrite", "content": "x"}]))
    assert str(raised.value).startswith("patch.edits[0]: op: ")
