"""Loading and checking a dataset folder (SPEC 1): reflact.dataset.load_dataset."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from reflact.dataset import load_dataset, load_trajectory
from reflact.errors import UserError
from tests.conftest import SKILL, make_config, write_dataset

CONV = [{"role": "user", "content": "hi"}]


def load(data_dir: Path, *overrides: str):
    return load_dataset(make_config(f"data.dir={data_dir}", *overrides).data)


def write_results(root: Path, lines: list[str]) -> Path:
    """A dataset folder with these raw results lines and a conversation for every id found."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "skill.md").write_text(SKILL, encoding="utf-8")
    (root / "results.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    for line in lines:
        try:
            run_id = json.loads(line).get("id")
        except (ValueError, AttributeError):
            continue
        if isinstance(run_id, str) and re.fullmatch(r"[A-Za-z0-9_.-]+", run_id) and run_id not in (".", ".."):
            folder = root / "predictions" / run_id
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "conversation.json").write_text(json.dumps(CONV), encoding="utf-8")
    return root


def row(run_id="a", hard=0, **extra) -> str:
    return json.dumps({"id": run_id, "hard": hard, **extra})


def user_error(data_dir: Path, *overrides: str) -> str:
    with pytest.raises(UserError) as info:
        load(data_dir, *overrides)
    return str(info.value)


# ---------------------------------------------------------------- good input


def test_results_are_sorted_by_id(tmp_path):
    data = write_dataset(tmp_path / "d", n_fail=7, n_succ=6, seed=3)
    on_disk = [json.loads(line)["id"] for line in (data / "results.jsonl").read_text().splitlines()]
    assert on_disk != sorted(on_disk)
    dataset = load(data)
    assert [r.id for r in dataset.results] == sorted(on_disk)
    assert dataset.skill == SKILL
    assert dataset.skipped == {}


def test_result_keeps_score_and_every_field(tmp_path):
    data = write_results(tmp_path / "d", [row("a", 0.25, task_description="T", extra_key=[1])])
    (result,) = load(data).results
    assert result.hard == 0.25
    assert result.fields["task_description"] == "T" and result.fields["extra_key"] == [1]


def test_blank_lines_are_ignored(tmp_path):
    data = write_results(tmp_path / "d", [row("b"), "", "   ", row("a", 1)])
    assert [r.id for r in load(data).results] == ["a", "b"]


def test_numeric_id_is_a_folder_name(tmp_path):
    data = write_results(tmp_path / "d", ['{"id": 17, "hard": 1}'])
    (data / "predictions" / "17").mkdir(parents=True)
    (data / "predictions" / "17" / "conversation.json").write_text(json.dumps(CONV))
    dataset = load(data)
    assert [r.id for r in dataset.results] == ["17"] and dataset.skipped == {}


def test_json_array_results_file_is_accepted(tmp_path):
    data = write_results(tmp_path / "d", [row("b"), row("a", 1)])
    rows = [json.loads(line) for line in (data / "results.jsonl").read_text().splitlines()]
    (data / "results.jsonl").unlink()
    (data / "results.json").write_text(json.dumps(rows, indent=2), encoding="utf-8")
    dataset = load(data)
    assert [(r.id, r.hard) for r in dataset.results] == [("a", 1.0), ("b", 0.0)]


def test_json_array_in_results_jsonl_is_accepted(tmp_path):
    data = write_results(tmp_path / "d", [row("b"), row("a", 1)])
    (data / "results.jsonl").write_text(json.dumps([json.loads(row("b")), json.loads(row("a", 1))]))
    assert [r.id for r in load(data).results] == ["a", "b"]


def test_unicode_line_separator_inside_a_string_is_valid_jsonl(tmp_path):
    line = json.dumps({"id": "a", "hard": 1, "task_description": "first\u2028second\x85third"}, ensure_ascii=False)
    data = write_results(tmp_path / "d", [line])
    (result,) = load(data).results
    assert result.fields["task_description"] == "first\u2028second\x85third"


def test_explicit_paths_without_data_dir(tmp_path):
    data = write_results(tmp_path / "d", [row("a")])
    cfg = make_config(f"data.skill={data / 'skill.md'}", f"data.results={data / 'results.jsonl'}")
    dataset = load_dataset(cfg.data)
    assert [r.id for r in dataset.results] == ["a"] and dataset.skipped == {}


# ---------------------------------------------------------------- extras (SPEC 1.1)


def test_extras_fall_back_to_the_runs_txt_files(tmp_path):
    data = write_results(tmp_path / "d", [row("a", reference_text="the truth")])
    folder = data / "predictions" / "a"
    (folder / "target_system_prompt.txt").write_text("SYS from file", encoding="utf-8")
    (folder / "target_user_prompt.txt").write_text("USER from file", encoding="utf-8")
    (folder / "spreadsheet_preview.txt").write_text("A1,B1", encoding="utf-8")
    dataset = load(data)
    traj = load_trajectory(dataset, dataset.results[0])
    assert traj.conversation == CONV
    assert traj.extras == {"reference_text": "the truth", "target_system_prompt": "SYS from file",
                           "target_user_prompt": "USER from file", "spreadsheet_preview": "A1,B1"}


def test_inline_extra_wins_over_its_file(tmp_path):
    data = write_results(tmp_path / "d", [row("a", target_system_prompt="SYS inline")])
    (data / "predictions" / "a" / "target_system_prompt.txt").write_text("SYS from file", encoding="utf-8")
    dataset = load(data)
    extras = load_trajectory(dataset, dataset.results[0]).extras
    assert extras["target_system_prompt"] == "SYS inline"


def test_missing_extras_are_empty(tmp_path):
    data = write_results(tmp_path / "d", [row("a")])
    dataset = load(data)
    extras = load_trajectory(dataset, dataset.results[0]).extras
    assert not any(extras.values())


# ---------------------------------------------------------------- skipped runs


def test_missing_and_empty_conversations_are_skipped_with_reason(tmp_path):
    data = write_dataset(tmp_path / "d", n_fail=3, n_succ=3, missing=1, empty=2)
    dataset = load(data)
    assert len(dataset.results) == 6
    assert dataset.skipped == {"run_00000": "missing conversation", "run_00001": "empty conversation",
                               "run_00002": "empty conversation"}


def test_empty_conversation_file_is_skipped_not_corrupt(tmp_path):
    data = write_results(tmp_path / "d", [row("a")])
    (data / "predictions" / "a" / "conversation.json").write_text("  \n")
    assert set(load(data).skipped) == {"a"}


# ---------------------------------------------------------------- bad results


def test_results_line_not_json_names_file_and_line(tmp_path):
    data = write_results(tmp_path / "d", [row("a"), "", "{not json"])
    assert f"{data / 'results.jsonl'}:3" in user_error(data)


@pytest.mark.parametrize("line", ['[1, 2]', '"a"', "7", "null"])
def test_results_line_not_an_object_names_file_and_line(tmp_path, line):
    data = write_results(tmp_path / "d", [row("a"), line])
    assert f"{data / 'results.jsonl'}:2" in user_error(data)


def test_result_without_id_names_file_and_line(tmp_path):
    data = write_results(tmp_path / "d", [row("a"), '{"hard": 1}'])
    message = user_error(data)
    assert f"{data / 'results.jsonl'}:2" in message and "'id'" in message


def test_result_without_hard_names_file_and_line(tmp_path):
    data = write_results(tmp_path / "d", [row("a"), '{"id": "b"}'])
    message = user_error(data)
    assert f"{data / 'results.jsonl'}:2" in message and "hard" in message and "missing" in message


@pytest.mark.parametrize("hard", ['"1"', '"0"', "null", "true", "false", "NaN", "Infinity", "[1]", "{}"])
def test_non_numeric_hard_names_file_and_line(tmp_path, hard):
    data = write_results(tmp_path / "d", [f'{{"id": "b", "hard": {hard}}}'])
    message = user_error(data)
    assert f"{data / 'results.jsonl'}:1" in message and "hard" in message


def test_duplicate_ids_name_both_lines(tmp_path):
    data = write_results(tmp_path / "d", [row("a"), row("b"), row("a", 1)])
    message = user_error(data)
    assert f"{data / 'results.jsonl'}:3" in message and "line 1" in message and "'a'" in message


def test_duplicate_ids_across_number_and_string(tmp_path):
    data = write_results(tmp_path / "d", ['{"id": 5, "hard": 0}', '{"id": "5", "hard": 1}'])
    assert "duplicate" in user_error(data)


@pytest.mark.parametrize("bad_id", ["..", ".", "a/b", "../x", "/abs", "a\\b", "", "   ", "a\x00b", "a\nb", "a\tb",
                                    None, True, 1.5, ["a"]])
def test_unsafe_ids_are_rejected_naming_file_and_line(tmp_path, bad_id):
    data = write_results(tmp_path / "d", [row("ok"), json.dumps({"id": bad_id, "hard": 0})])
    message = user_error(data)
    assert f"{data / 'results.jsonl'}:2" in message and "id" in message


def test_json_array_error_names_the_item_not_a_line(tmp_path):
    data = write_results(tmp_path / "d", [row("a")])
    (data / "results.jsonl").unlink()
    (data / "results.json").write_text(json.dumps([{"id": "a", "hard": 0}, {"id": "b"}], indent=2))
    message = user_error(data)
    assert "item 2" in message


def test_json_array_results_file_that_does_not_parse_names_the_file(tmp_path):
    data = write_results(tmp_path / "d", [row("a")])
    (data / "results.jsonl").write_text('[{"id": "a", "hard": 0},\n  {"id": ')
    assert str(data / "results.jsonl") in user_error(data)


def test_results_file_not_utf8_names_the_file(tmp_path):
    data = write_results(tmp_path / "d", [row("a")])
    (data / "results.jsonl").write_bytes(b'{"id": "a", "hard": 0, "task_description": "caf\xe9"}\n')
    message = user_error(data)
    assert str(data / "results.jsonl") in message and "UTF-8" in message


@pytest.mark.parametrize("content", ["", "\n\n  \n", "[]"])
def test_results_file_without_results_is_an_error(tmp_path, content):
    data = write_results(tmp_path / "d", [row("a")])
    (data / "results.jsonl").write_text(content)
    message = user_error(data)
    assert str(data / "results.jsonl") in message and "no results" in message


def test_missing_results_file_names_the_key(tmp_path):
    data = write_results(tmp_path / "d", [row("a")])
    (data / "results.jsonl").unlink()
    assert "data.results" in user_error(data)


def test_missing_data_dir_names_the_key(tmp_path):
    message = user_error(tmp_path / "no_such_folder")
    assert "data.dir" in message and "no_such_folder" in message


def test_missing_skill_names_the_key_and_file(tmp_path):
    data = write_results(tmp_path / "d", [row("a")])
    (data / "skill.md").unlink()
    message = user_error(data)
    assert "data.skill" in message and str(data / "skill.md") in message


def test_skill_not_utf8_names_the_file(tmp_path):
    data = write_results(tmp_path / "d", [row("a")])
    (data / "skill.md").write_bytes(b"# Skill \xff\n")
    assert str(data / "skill.md") in user_error(data)


# ---------------------------------------------------------------- corrupt conversations

CORRUPT = {
    "not_json": b'[{"role": "user", "content": "hi"}',
    "not_a_list": b'{"role": "user", "content": "hi"}',
    "null": b"null",
    "not_utf8": b'[{"role": "user", "content": "caf\xe9"}]',
}


@pytest.mark.parametrize("kind", sorted(CORRUPT))
def test_corrupt_conversation_is_a_user_error_naming_the_file(tmp_path, kind):
    data = write_results(tmp_path / "d", [row("a"), row("b", 1)])
    path = data / "predictions" / "b" / "conversation.json"
    path.write_bytes(CORRUPT[kind])
    message = user_error(data)
    assert str(path) in message and "on_bad_conversation" in message


@pytest.mark.parametrize("kind", sorted(CORRUPT))
def test_corrupt_conversation_is_skipped_with_its_error_when_asked(tmp_path, kind):
    data = write_results(tmp_path / "d", [row("a"), row("b", 1)])
    path = data / "predictions" / "b" / "conversation.json"
    path.write_bytes(CORRUPT[kind])
    dataset = load(data, "data.on_bad_conversation=skip")
    assert list(dataset.skipped) == ["b"]
    assert str(path) in dataset.skipped["b"]
    assert [r.id for r in dataset.results] == ["a", "b"]


def test_corrupt_conversations_after_the_first_good_ones_are_all_checked_up_front(tmp_path):
    data = write_results(tmp_path / "d", [row(f"r{i}") for i in range(5)])
    (data / "predictions" / "r4" / "conversation.json").write_text("{")
    assert str(data / "predictions" / "r4" / "conversation.json") in user_error(data)
