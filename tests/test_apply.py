"""Applying a patch to a skill (SPEC 5): order, first occurrence, fallbacks, protected regions."""

from __future__ import annotations

from reflact.replies.apply import EditStatus, append_point, apply_counts, apply_edits, protected_regions, unified_diff

SLOW = "<!-- SLOW_UPDATE_START -->\n- Never refund a disputed order.\n<!-- SLOW_UPDATE_END -->\n"
APPX = "<!-- APPENDIX_START -->\n- Remember to log.\n<!-- APPENDIX_END -->\n"
BODY = "# Skill\n\n## Orders\n- Look up the order first.\n- Amounts are in cents.\n"


def run(skill, *edits):
    return apply_edits(skill, list(edits))


def statuses(result):
    return [(s.op, s.status, s.reason) for s in result[1]]


# ---------------------------------------------------------------- append


def test_append_at_the_end_without_protected_regions():
    text, st = run(BODY, {"op": "append", "content": "- Confirm before refunds."})
    assert text == BODY + "- Confirm before refunds.\n"
    assert st == [EditStatus(0, "append", "applied", "")]


def test_append_to_text_without_final_newline_and_to_empty_text():
    assert run("a", {"op": "append", "content": "b"})[0] == "a\nb\n"
    assert run("", {"op": "append", "content": "b\n"})[0] == "b\n"


def test_append_goes_before_trailing_protected_regions():
    skill = BODY + "\n" + SLOW + "\n" + APPX
    text, _ = run(skill, {"op": "append", "content": "- New rule."})
    assert text == BODY + "- New rule.\n" + "\n" + SLOW + "\n" + APPX
    assert text.endswith(APPX)


def test_append_goes_at_the_end_when_content_follows_the_protected_region():
    skill = BODY + SLOW + "## Tail\n- after\n"
    text, _ = run(skill, {"op": "append", "content": "- New rule."})
    assert text == skill + "- New rule.\n"


def test_append_point_is_before_the_first_of_several_trailing_regions():
    skill = BODY + SLOW + APPX + "  \n"
    assert append_point(skill) == len(BODY)
    assert append_point(BODY) == len(BODY)


def test_append_to_a_skill_that_is_only_protected():
    text, _ = run(SLOW, {"op": "append", "content": "- x"})
    assert text == "- x\n" + SLOW


# ---------------------------------------------------------------- insert_after


def test_insert_after_puts_content_on_the_line_after_the_target_line():
    text, st = run(BODY, {"op": "insert_after", "target": "Look up the order", "content": "- Check the dispute flag."})
    assert "- Look up the order first.\n- Check the dispute flag.\n- Amounts are in cents.\n" in text
    assert st[0].status == "applied"


def test_insert_after_a_target_that_ends_with_its_newline():
    text, _ = run("a\nb\nc\n", {"op": "insert_after", "target": "a\n", "content": "x"})
    assert text == "a\nx\nb\nc\n"


def test_insert_after_on_a_last_line_without_newline():
    text, _ = run("a\nb", {"op": "insert_after", "target": "b", "content": "x"})
    assert text == "a\nb\nx\n"


def test_insert_after_a_multiline_target_uses_the_line_where_it_ends():
    text, _ = run("a\nb\nc\n", {"op": "insert_after", "target": "a\nb", "content": "x"})
    assert text == "a\nb\nx\nc\n"


def test_insert_after_missing_target_falls_back_to_append_before_protected_tail():
    skill = BODY + SLOW
    text, st = run(skill, {"op": "insert_after", "target": "no such line", "content": "- x"})
    assert text == BODY + "- x\n" + SLOW
    assert st == [EditStatus(0, "insert_after", "fallback", "target not found")]


def test_insert_after_line_that_opens_a_protected_region_is_skipped():
    skill = "intro <!-- SLOW_UPDATE_START -->\nkept\n<!-- SLOW_UPDATE_END -->\n"
    text, st = run(skill, {"op": "insert_after", "target": "intro", "content": "x"})
    assert text == skill
    assert statuses((text, st)) == [("insert_after", "skipped", "insertion point in protected region")]


def test_insert_after_the_line_before_a_region_inserts_before_the_region():
    skill = "a\n" + SLOW
    text, st = run(skill, {"op": "insert_after", "target": "a", "content": "x"})
    assert text == "a\nx\n" + SLOW
    assert st[0].status == "applied"


# ---------------------------------------------------------------- replace / delete


def test_replace_changes_only_the_first_occurrence():
    text, st = run("rule\nrule\n", {"op": "replace", "target": "rule", "content": "RULE"})
    assert text == "RULE\nrule\n"
    assert st[0].status == "applied"


def test_delete_removes_only_the_first_occurrence_and_its_line_break():
    text, _ = run("- a\n- b\n- a\n", {"op": "delete", "target": "- a"})
    assert text == "- b\n- a\n"


def test_delete_inside_a_line_keeps_the_line():
    text, _ = run("Amounts are in cents.\n", {"op": "delete", "target": " in cents"})
    assert text == "Amounts are.\n"


def test_delete_of_a_last_line_without_newline():
    assert run("a\nb", {"op": "delete", "target": "b"})[0] == "a"


def test_replace_and_delete_are_skipped_when_the_target_is_missing():
    text, st = run(
        BODY,
        {"op": "replace", "target": "absent", "content": "x"},
        {"op": "delete", "target": "absent"},
    )
    assert text == BODY
    assert statuses((text, st)) == [
        ("replace", "skipped", "target not found"),
        ("delete", "skipped", "target not found"),
    ]


# ---------------------------------------------------------------- order and evolving text


def test_edits_apply_in_order_to_the_evolving_text():
    text, st = run(
        "a\n",
        {"op": "append", "content": "- fresh rule"},
        {"op": "replace", "target": "fresh", "content": "refined"},
        {"op": "insert_after", "target": "refined rule", "content": "- follow-up"},
    )
    assert text == "a\n- refined rule\n- follow-up\n"
    assert [s.status for s in st] == ["applied"] * 3
    assert [s.index for s in st] == [0, 1, 2]


def test_a_deleted_target_is_gone_for_later_edits():
    text, st = run("x\ny\n", {"op": "delete", "target": "x"}, {"op": "replace", "target": "x", "content": "z"})
    assert text == "y\n"
    assert [s.status for s in st] == ["applied", "skipped"]


# ---------------------------------------------------------------- protected regions


def test_targets_inside_or_overlapping_a_middle_region_are_skipped():
    skill = BODY + SLOW + "## Later\n- tail rule\n"
    edits = [
        {"op": "replace", "target": "Never refund", "content": "Always refund"},
        {"op": "delete", "target": "<!-- SLOW_UPDATE_END -->"},
        {"op": "replace", "target": "cents.\n<!-- SLOW", "content": "x"},  # overlaps the start
        {"op": "insert_after", "target": "disputed order.", "content": "x"},
        {"op": "replace", "target": "tail rule", "content": "last rule"},
    ]
    text, st = apply_edits(skill, edits)
    assert [s.reason for s in st[:4]] == ["target in protected region"] * 4
    assert [s.status for s in st] == ["skipped"] * 4 + ["applied"]
    assert text == BODY + SLOW + "## Later\n- last rule\n"


def test_first_occurrence_inside_a_region_skips_even_if_a_later_one_is_free():
    skill = APPX + "- Remember to log.\n"
    text, st = run(skill, {"op": "delete", "target": "Remember to log."})
    assert text == skill
    assert st[0].reason == "target in protected region"


def test_appendix_region_at_the_end_is_protected():
    skill = BODY + APPX
    text, st = run(skill, {"op": "replace", "target": "Remember", "content": "Forget"})
    assert text == skill and st[0].status == "skipped"


def test_unterminated_region_protects_to_the_end_and_lone_end_marker_protects_itself():
    skill = "a\n<!-- APPENDIX_START -->\nb\n"
    assert protected_regions(skill)[0].end == len(skill)
    assert run(skill, {"op": "delete", "target": "b"})[1][0].status == "skipped"
    lone = "a\n<!-- SLOW_UPDATE_END -->\nb\n"
    assert run(lone, {"op": "delete", "target": "SLOW_UPDATE_END"})[1][0].status == "skipped"
    assert run(lone, {"op": "delete", "target": "b"})[0] == "a\n<!-- SLOW_UPDATE_END -->\n"


def test_content_with_a_protected_marker_is_skipped():
    text, st = run(BODY, {"op": "append", "content": "<!-- APPENDIX_END -->"})
    assert text == BODY
    assert st[0].reason == "content contains a protected-region marker"


# ---------------------------------------------------------------- malformed edits


def test_unknown_op_missing_content_and_missing_target_are_skipped():
    text, st = run(
        BODY,
        {"op": "rewrite", "content": "x"},
        {"op": "append"},
        {"op": "replace", "target": "cents", "content": 5},
        {"op": "insert_after", "content": "x"},
        {"op": "delete", "target": ""},
        "not an edit",
    )
    assert text == BODY
    assert statuses((text, st)) == [
        ("rewrite", "skipped", "unknown op"),
        ("append", "skipped", "missing content"),
        ("replace", "skipped", "missing content"),
        ("insert_after", "skipped", "missing target"),
        ("delete", "skipped", "missing target"),
        ("", "skipped", "edit is not an object"),
    ]


def test_replace_with_empty_content_removes_the_target():
    assert run("a\nb\n", {"op": "replace", "target": "a", "content": ""})[0] == "b\n"


def test_input_list_is_not_mutated():
    edits = [{"op": "append", "content": "x"}]
    apply_edits("a\n", edits)
    assert edits == [{"op": "append", "content": "x"}]


# ---------------------------------------------------------------- diff and counts


def test_unified_diff_names_the_file_and_shows_changes():
    diff = unified_diff("a\nb\n", "a\nc\n", "skill.md")
    assert diff.splitlines()[:2] == ["--- a/skill.md", "+++ b/skill.md"]
    assert "-b\n" in diff and "+c\n" in diff
    assert unified_diff("same\n", "same\n", "skill.md") == ""


def test_unified_diff_marks_a_missing_final_newline():
    diff = unified_diff("a", "b", "s.md")
    assert "-a\n\\ No newline at end of file\n+b\n\\ No newline at end of file\n" in diff


def test_apply_counts():
    _, st = run(
        "a\n",
        {"op": "append", "content": "b"},
        {"op": "insert_after", "target": "zzz", "content": "c"},
        {"op": "delete", "target": "zzz"},
        {"op": "nope"},
    )
    assert apply_counts(st) == {"applied": 1, "fallback": 1, "skipped": 2, "total": 4, "apply_share": 0.5}
    assert apply_counts([]) == {"applied": 0, "fallback": 0, "skipped": 0, "total": 0, "apply_share": 0.0}


# ---------------------------------------------------------------- found by mutation testing (bench/mutants.py)


def test_append_goes_before_nested_or_overlapping_regions_at_the_end():
    nested = ("<!-- SLOW_UPDATE_START -->\nx\n<!-- APPENDIX_START -->\ny\n<!-- APPENDIX_END -->\nz\n"
              "<!-- SLOW_UPDATE_END -->\n")
    overlapping = ("<!-- SLOW_UPDATE_START -->\nx\n<!-- APPENDIX_START -->\ny\n<!-- SLOW_UPDATE_END -->\nz\n"
                   "<!-- APPENDIX_END -->\n")
    for regions in (nested, overlapping):
        assert run("a\n" + regions, {"op": "append", "content": "b"})[0] == "a\nb\n" + regions
        assert append_point("a\n" + regions) == 2


def test_a_lone_end_marker_at_the_very_start_protects_itself():
    skill = "<!-- APPENDIX_END -->\n- rule\n"
    assert [(s.start, s.end) for s in protected_regions(skill)] == [(0, len("<!-- APPENDIX_END -->"))]
    assert statuses(run(skill, {"op": "delete", "target": "APPENDIX_END"})) == [
        ("delete", "skipped", "target in protected region")]


def test_each_status_names_its_edits_op():
    result = run(BODY, {"op": "replace", "target": "Amounts", "content": "Sums"}, {"op": "delete", "target": "# Skill"},
                 {"op": "insert_after", "target": "## Orders", "content": "- x"}, {"op": "append", "content": "- y"})
    assert statuses(result) == [("replace", "applied", ""), ("delete", "applied", ""), ("insert_after", "applied", ""),
                                ("append", "applied", "")]


def test_deleting_a_first_or_last_line_takes_its_line_break_with_it():
    assert run("first\nlast", {"op": "delete", "target": "first"})[0] == "last"
    assert run("\nlast", {"op": "delete", "target": "last"})[0] == ""
    assert run("only", {"op": "delete", "target": "only"})[0] == ""


def test_a_target_next_to_a_region_is_not_in_it():
    skill = "a\n<!-- SLOW_UPDATE_START -->\nx\n<!-- SLOW_UPDATE_END -->\nb"
    assert run(skill, {"op": "delete", "target": "a\n"})[0] == skill[2:]  # ends where the region starts
    after = run(skill, {"op": "replace", "target": "\nb", "content": "\nc"})  # starts where it ends
    assert after[0] == skill[:-1] + "c" and statuses(after) == [("replace", "applied", "")]


def test_every_region_of_a_kind_is_protected_and_the_text_between_is_not():
    skill = ("<!-- SLOW_UPDATE_END -->\nfree 1\n<!-- SLOW_UPDATE_START -->\nkept 1\n<!-- SLOW_UPDATE_END -->\n"
             "free 2\n<!-- SLOW_UPDATE_START -->\nkept 2\n<!-- SLOW_UPDATE_END -->\nfree 3\n")
    end = len("<!-- SLOW_UPDATE_END -->")
    first, second = skill.index("<!-- SLOW_UPDATE_START -->"), skill.rindex("<!-- SLOW_UPDATE_START -->")
    assert [(r.start, r.end) for r in protected_regions(skill)] == [
        (0, end), (first, skill.index("\nfree 2")), (second, skill.rindex("\nfree 3"))]
    for line in ("kept 1", "kept 2"):
        assert statuses(run(skill, {"op": "delete", "target": line})) == [
            ("delete", "skipped", "target in protected region")]
    for line in ("free 1", "free 2", "free 3"):
        assert run(skill, {"op": "delete", "target": line})[0] == skill.replace(line + "\n", "")


def test_statuses_carry_the_edits_index_and_op_whatever_happened():
    skill = BODY + "see below <!-- APPENDIX_START -->\n- kept\n<!-- APPENDIX_END -->\n"
    result = run(skill, "not an edit", {"op": 5}, {"op": "delete", "target": "zzz"},
                 {"op": "delete", "target": "- kept"}, {"op": "insert_after", "target": "see below", "content": "x"},
                 {"op": "delete", "target": "Amounts are in cents."})
    assert [(s.index, s.op, s.status) for s in result[1]] == [
        (0, "", "skipped"), (1, "", "skipped"), (2, "delete", "skipped"), (3, "delete", "skipped"),
        (4, "insert_after", "skipped"), (5, "delete", "applied")]
    assert result[1][4].reason == "insertion point in protected region"


def test_delete_takes_only_what_the_target_and_its_own_line_break_cover():
    assert run("Look up the order.\nnext", {"op": "delete", "target": "Look up "})[0] == "the order.\nnext"
    assert run("a\n\nb", {"op": "delete", "target": "a\n"})[0] == "\nb"  # the blank line after it stays
    assert run("ab\ncd", {"op": "delete", "target": "cd"})[0] == "ab"


def test_insert_after_never_lands_after_an_unterminated_start_marker():
    for skill in ("x\nnote <!-- APPENDIX_START -->", "x\nnote <!-- APPENDIX_START -->\n"):
        text, st = run(skill, {"op": "insert_after", "target": "note", "content": "NEW"})
        assert (text, st[0].status, st[0].reason) == (skill, "skipped", "insertion point in protected region")
    closed = "note <!-- SLOW_UPDATE_START -->x<!-- SLOW_UPDATE_END -->"  # a closed region: the end is outside
    assert run(closed, {"op": "insert_after", "target": "note", "content": "NEW"})[0] == closed + "\nNEW\n"
