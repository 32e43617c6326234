"""Finding the one JSON object in an optimizer reply (SPEC 4): reflact.parse.extract_object."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from reflact.parse import ParseError, extract_object

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


# ---------------------------------------------------------------- properties

HYP = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# fragments that steer random text towards the parser's interesting paths
_FRAGMENTS = st.sampled_from(
    ["{", "}", "[", "]", '"', ":", ",", "\\", "\n", " ", "a", "1", "True", "None", "é", "ß", "```json\n", "```",
     '{"a": ', '"k": "v"', "}}", "{{"]
)
ANY_TEXT = st.one_of(st.text(max_size=200), st.lists(_FRAGMENTS, max_size=40).map("".join))

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
def test_property_only_a_dict_or_parse_error(text):
    _dict_or_parse_error(text)


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
