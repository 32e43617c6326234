"""Finding the one JSON object in an optimizer reply (SPEC 4): reflact.replies.parse.extract_object."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from reflact.replies.parse import MAX_DEPTH, ParseError, _closers, extract_object

PATCH = {"patch": {"reasoning": "r", "edits": [{"op": "append", "content": "x"}]}}
PATCH_JSON = json.dumps(PATCH)


def test_bare_object():
    assert extract_object(PATCH_JSON) == PATCH


def test_object_with_prose_before_and_after():
    text = f"Here is my analysis.\n\n{PATCH_JSON}\n\nLet me know if you need more."
    assert extract_object(text) == PATCH


def test_json_fenced_object():
    text = f"My answer:\n```json\n{json.dumps(PATCH, indent=2)}\n```\nDone."
    assert extract_object(text) == PATCH


def test_fence_without_language_tag():
    text = f"My answer:\n```\n{PATCH_JSON}\n```\n"
    assert extract_object(text) == PATCH


def test_two_different_objects_are_an_error_never_a_guess():
    text = 'First: {"a": 1}\nSecond: {"a": 2}'
    with pytest.raises(ParseError, match="2 different"):
        extract_object(text)


def test_two_different_fenced_objects_are_an_error():
    text = '```json\n{"a": 1}\n```\nor maybe\n```json\n{"b": 1}\n```'
    with pytest.raises(ParseError):
        extract_object(text)


def test_two_identical_objects_are_fine():
    text = f"Draft: {PATCH_JSON}\nFinal (same): {json.dumps(PATCH, indent=1)}"
    assert extract_object(text) == PATCH


def test_prose_brace_before_the_object_is_not_json():
    text = f"Use {{name}} here as the placeholder.\n{PATCH_JSON}"
    assert extract_object(text) == PATCH


def test_unclosed_prose_brace_before_the_object_is_not_json():
    text = f"Note: the `{{` character must be escaped in templates.\n{PATCH_JSON}"
    assert extract_object(text) == PATCH


def test_brace_inside_a_json_string_value():
    obj = {"patch": {"reasoning": "r", "edits": [{"op": "append", "content": "a } b {"}]}}
    assert extract_object(f"Answer: {json.dumps(obj)} -- end") == obj


def test_truncated_reply_says_it_was_cut_off():
    text = 'Here is the patch:\n{"patch": {"reasoning": "long", "edits": [{"op": "append", "content": "par'
    with pytest.raises(ParseError, match="cut off"):
        extract_object(text)


def test_truncated_fenced_reply_says_it_was_cut_off():
    text = '```json\n{"patch": {"reasoning": "long", "edits": ['
    with pytest.raises(ParseError, match="cut off"):
        extract_object(text)


def test_single_almost_json_object_is_repaired():
    text = 'Result:\n{"ok": True, "missing": None, "no": False, "items": [1, 2,],}\nthanks'
    assert extract_object(text) == {"ok": True, "missing": None, "no": False, "items": [1, 2]}


def test_repair_leaves_string_contents_alone():
    text = 'Result: {"content": "True, None,}", "n": 1,}'
    assert extract_object(text) == {"content": "True, None,}", "n": 1}


def test_two_malformed_objects_are_an_error():
    text = 'One: {"a": 1,}\nTwo: {"b": True,}'
    with pytest.raises(ParseError, match="2 malformed"):
        extract_object(text)


def test_malformed_object_with_non_ascii_word_is_a_parse_error():
    with pytest.raises(ParseError):
        extract_object('{"a": é}')


def test_unrepairable_object_is_an_error():
    with pytest.raises(ParseError, match="does not parse"):
        extract_object('Answer: {"a": [1 2]}')


def test_json_array_is_an_error():
    with pytest.raises(ParseError, match="list"):
        extract_object('[{"a": 1}, {"a": 2}]')


@pytest.mark.parametrize("text", ["", "   \n\t ", None, 42])
def test_empty_or_non_text_reply_is_an_error(text):
    with pytest.raises(ParseError):
        extract_object(text)


def test_reply_without_any_object_is_an_error():
    with pytest.raises(ParseError, match="no JSON object"):
        extract_object("I could not find anything to change.")


def test_raw_newlines_inside_strings_are_accepted():
    text = 'Answer:\n{"patch": {"reasoning": "line one\nline two", "edits": []}}'
    assert extract_object(text)["patch"]["reasoning"] == "line one\nline two"


def test_raw_newlines_inside_strings_of_a_bare_object():
    assert extract_object('{"a": "x\ny"}') == {"a": "x\ny"}



# ---------------------------------------------------------------- fences and bare text together


def _fence(obj, indent=2):
    return f"```json\n{json.dumps(obj, indent=indent)}\n```"


def test_fenced_object_beside_a_different_bare_object_is_an_error():
    text = f'A first try: {{"a": 1}}\nThe answer:\n{_fence(PATCH)}'
    with pytest.raises(ParseError, match="2 different"):
        extract_object(text)


def test_bare_object_after_a_different_fenced_object_is_an_error():
    text = f'{_fence(PATCH)}\nOr, shorter: {{"patch": {{"reasoning": "r", "edits": []}}}}'
    with pytest.raises(ParseError, match="2 different"):
        extract_object(text)


def test_same_object_fenced_and_bare_is_one_candidate():
    text = f"Draft: {PATCH_JSON}\nFinal:\n{_fence(PATCH)}"
    assert extract_object(text) == PATCH


def test_fence_inside_a_bare_objects_string_is_part_of_it():
    # a rewritten skill may show a fenced example; it is text in new_skill, not a second candidate
    skill = "# Skill\nReply like this:\n```json\n{}\n```\nand nothing else."
    obj = {"patch": {"reasoning": "r", "skill_candidates": [{"title": "t", "change_summary": [], "new_skill": skill}]}}
    raw_newlines = json.dumps(obj).replace("\\n", "\n")  # as models often write long strings
    assert extract_object(f"Here it is:\n{raw_newlines}\nDone.") == obj


# ---------------------------------------------------------------- lists


@pytest.mark.parametrize("wrap", [lambda body: body, lambda body: f"My answer:\n```json\n{body}\n```\n"],
                         ids=["bare", "fenced"])
def test_list_of_one_object_is_that_object(wrap):
    assert extract_object(wrap(json.dumps([PATCH], indent=1))) == PATCH


@pytest.mark.parametrize("wrap", [lambda body: body, lambda body: f"My answer:\n```json\n{body}\n```\n"],
                         ids=["bare", "fenced"])
@pytest.mark.parametrize("items", [[{"a": 1}, {"a": 2}], [{"a": 1}, {"a": 1}], [{"a": 1}, "note"]],
                         ids=["different", "identical", "object-and-text"])
def test_list_of_several_items_with_an_object_is_an_error(wrap, items):
    with pytest.raises(ParseError, match="list of 2 items"):
        extract_object(wrap(json.dumps(items)))


@pytest.mark.parametrize("text", ["[1, 2]", "[]", '["a"]'])
def test_list_without_an_object_is_not_an_object(text):
    with pytest.raises(ParseError, match="a list, not an object"):
        extract_object(text)


# ---------------------------------------------------------------- hostile replies


def _deep(levels: int) -> str:
    return '{"a": ' * levels + "1" + "}" * levels


@pytest.mark.parametrize("text", [
    _deep(5000),
    f"Answer: {_deep(5000)} end",
    f"```json\n{_deep(5000)}\n```",
    "[" * 50000 + "]" * 50000,
], ids=["whole", "in-prose", "fenced", "deep-list"])
def test_deep_nesting_is_a_parse_error(text):
    with pytest.raises(ParseError):
        extract_object(text)


def test_nesting_limit_is_exact():
    assert extract_object(_deep(MAX_DEPTH)) == json.loads(_deep(MAX_DEPTH))
    assert extract_object(f"Answer: {_deep(MAX_DEPTH)}") == json.loads(_deep(MAX_DEPTH))
    with pytest.raises(ParseError, match=f"nested more than {MAX_DEPTH} levels"):
        extract_object(_deep(MAX_DEPTH + 1))
    with pytest.raises(ParseError, match=f"nested more than {MAX_DEPTH} levels"):
        extract_object(f"Answer: {_deep(MAX_DEPTH + 1)}")


@pytest.mark.parametrize("text", ['{"a": ' + "7" * 5000 + "}", 'Answer: {"a": ' + "7" * 5000 + "}", "7" * 5000])
def test_number_past_pythons_digit_limit_is_a_parse_error(text):
    with pytest.raises(ParseError):
        extract_object(text)


def test_object_closed_by_a_bracket_is_malformed_not_cut_off():
    with pytest.raises(ParseError, match="does not parse"):
        extract_object('Answer: {"a": 1]')


N = 20_000  # characters: the size at which the rescanning parser took half a minute


@pytest.mark.parametrize("text, message", [
    ("{" * N, "no JSON object"),
    ('{"a": ' * (N // 6), "cut off"),
    ("[" * N, "no JSON object"),
    ('{"' * (N // 2), "no JSON object"),
    ('{"a" ' * (N // 5), "no JSON object"),
    ('{["\\' * (N // 4), "no JSON object"),
    ("```json\n{" * (N // 9), "no JSON object"),
], ids=["braces", "object-starts", "brackets", "brace-quote", "keys-without-colon", "mixed", "fences"])
def test_brace_heavy_reply_gets_its_error(text, message):
    with pytest.raises(ParseError, match=message):
        extract_object(text)


@pytest.mark.parametrize("before", [
    "{" * N, "[" * N, '"' * (N + 1), "}" * N, "{ " * N, 'Use { and " here: ' * (N // 18), "\\" * N,
], ids=["braces", "brackets", "odd-quotes", "closers", "spaced-braces", "brace-and-quote", "backslashes"])
def test_object_after_brace_heavy_prose_is_found(before):
    assert extract_object(f"{before}\n{PATCH_JSON}\n") == PATCH


# ---------------------------------------------------------------- properties

HYP = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# fragments that steer random text towards the parser's interesting paths
_FRAGMENTS = st.sampled_from(
    ["{", "}", "[", "]", '"', ":", ",", "\\", "\n", " ", "a", "1", "True", "None", "é", "ß", "```json\n", "```",
     '{"a": ', '"k": "v"', "}}", "{{", "[{", "}]", '\\"', "1" * 4400, PATCH_JSON]
)
ANY_TEXT = st.one_of(st.text(max_size=200), st.lists(_FRAGMENTS, max_size=40).map("".join))
# a few fragments repeated many times: the shapes that once made the parser quadratic
REPEATED = st.lists(st.tuples(_FRAGMENTS, st.integers(1, 2000)), min_size=1, max_size=4).map(
    lambda parts: "".join(fragment * times for fragment, times in parts))

JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-10**6, 10**6),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20),
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)
JSON_OBJECTS = st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=5)
# prose a model writes around its answer: anything but braces and fence backticks
PROSE = st.text(st.characters(blacklist_characters="{}`", blacklist_categories=("Cs",)), max_size=80)


def _dict_or_parse_error(text):
    try:
        result = extract_object(text)
    except ParseError:
        return
    assert isinstance(result, dict)


@HYP
@given(ANY_TEXT)
@example('{"a": é}')
@example('{"a": ' + "1" * 5000 + "}")
def test_property_only_a_dict_or_parse_error(text):
    _dict_or_parse_error(text)


@settings(HYP, max_examples=60)
@given(REPEATED)
def test_property_long_repetitive_text_gives_a_dict_or_parse_error(text):
    _dict_or_parse_error(text)


def _rescanned_closer(text, start):
    """The definition the one-pass scanner must meet: from the opener at `start`, reading quotes
    from there on, the index where the bracket depth first returns to 0 (-1 if never)."""
    depth, inside, escaped = 0, False, False
    for pos in range(start, len(text)):
        ch = text[pos]
        if inside:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                inside = False
            continue
        if ch == '"':
            inside = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return pos
    return -1


@settings(HYP, max_examples=500)
@given(st.lists(st.sampled_from(["{", "}", "[", "]", '"', "\\", "a", " "]), max_size=40).map("".join))
def test_property_one_pass_scanner_meets_the_rescanning_definition(text):
    positions, chars, closer = _closers(text)
    for k, ch in enumerate(chars):
        if ch in "{[":
            assert (positions[closer[k]] if closer[k] >= 0 else -1) == _rescanned_closer(text, positions[k])


@HYP
# non-empty: prose '"' around '{}' would make the whole reply the JSON string "{}"
@given(PROSE, JSON_OBJECTS.filter(bool), PROSE, st.booleans())
def test_property_object_in_prose_is_found(before, obj, after, indent):
    text = before + json.dumps(obj, indent=2 if indent else None, ensure_ascii=False) + after
    assert extract_object(text) == obj


@HYP
@given(PROSE, JSON_OBJECTS, PROSE, JSON_OBJECTS, PROSE)
def test_property_two_different_objects_never_pick_one(p1, first, p2, second, p3):
    if json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True):
        return
    text = p1 + json.dumps(first) + p2 + json.dumps(second) + p3
    with pytest.raises(ParseError):
        extract_object(text)


# prose that never closes a bracket and has no quote: whatever it opens, the object after it stands
OPEN_PROSE = st.text(st.sampled_from("{[\\ a:,\n"), max_size=300)
CALM_PROSE = st.text(st.characters(blacklist_characters="{}[]`", blacklist_categories=("Cs",)), max_size=80)


@HYP
@given(OPEN_PROSE, JSON_OBJECTS.filter(bool), CALM_PROSE)
def test_property_object_after_unclosed_prose_brackets_is_found(before, obj, after):
    assert extract_object(before + json.dumps(obj) + after) == obj


@HYP
@given(PROSE, JSON_OBJECTS, PROSE, JSON_OBJECTS, PROSE, st.booleans())
def test_property_fenced_and_different_bare_object_never_pick_one(p1, fenced, p2, bare, p3, fence_first):
    if json.dumps(fenced, sort_keys=True) == json.dumps(bare, sort_keys=True):
        return
    parts = [f"```json\n{json.dumps(fenced, indent=2)}\n```", json.dumps(bare)]
    first, second = parts if fence_first else parts[::-1]
    with pytest.raises(ParseError):
        extract_object(p1 + first + p2 + second + p3)


@HYP
@given(PROSE, JSON_OBJECTS.filter(bool), PROSE, PROSE)
def test_property_same_object_fenced_and_bare_is_taken(p1, obj, p2, p3):
    text = p1 + json.dumps(obj) + p2 + f"\n```json\n{json.dumps(obj, indent=2)}\n```\n" + p3
    assert extract_object(text) == obj


def test_a_fence_inside_a_bare_object_does_not_hide_a_later_fenced_object():
    # a skill text with a fenced example, its line breaks raw (as models write them)
    inner = '{"skill": "Example:\n```json\n{\\"a\\": 1}\n```\n"}'
    assert "\n```json\n" in inner
    other = {"patch": {"reasoning": "other", "edits": []}}
    with pytest.raises(ParseError, match="2 different JSON objects"):
        extract_object(f"{inner}\n\nOr rather:\n```json\n{json.dumps(other)}\n```")
    # the later object only in its fence (the braces around it make no object of the bare text)
    with pytest.raises(ParseError, match="2 different JSON objects"):
        extract_object(f"{inner}\n\nOr rather {{\n```json\n{json.dumps(other)}\n```\n}}")


def test_a_number_too_long_for_python_is_named_as_the_cause():
    with pytest.raises(ParseError, match=r"^the JSON object does not parse: a number has too many digits$"):
        extract_object('Here: {"count": ' + "7" * 5000 + ",}")
