"""Loading and checking a dataset folder (SPEC 1): reflact.inputs.dataset.load_dataset."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest

from reflact.core.errors import UserError
from reflact.inputs.dataset import load_dataset, load_trajectory
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
        except (ValueError, AttributeError, RecursionError):  # hostile lines get no folder
            continue
        if (isinstance(run_id, str) and re.fullmatch(r"[A-Za-z0-9_.-]{1,255}", run_id)
                and run_id not in (".", "..")):
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


@pytest.mark.parametrize("hard", ['"1"', '"0"', "null", "true", "false", "NaN", "Infinity", "[1]", "{}",
                                  "1" + "0" * 400, "-1" + "0" * 400, "1e400"])
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
                                    None, True, 1.5, ["a"],
                                    # other line breaks and controls: they would forge prompt lines
                                    "a\x0bb", "a\x0cb", "a\x1cb", "a\x7fb", "a\x85b", "a\x9bb", "a\u2028b", "a\u2029b",
                                    "a\ud800b",  # a lone surrogate: no file name, no UTF-8
                                    "x" * 256, "é" * 128, 10 ** 300])  # over 255 bytes as a folder name
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


@pytest.mark.parametrize("content", ["", "\n\n  \n", "[]", "  [ ]\n"], ids=["no lines", "blank lines", "[]", "[ ]"])
def test_results_file_without_results_is_a_dataset_of_zero_results(tmp_path, content):
    # SPEC 2: a stage with no results still logs its (empty) summary
    data = write_results(tmp_path / "d", [row("a")])
    (data / "results.jsonl").write_text(content)
    dataset = load(data)
    assert dataset.results == [] and dataset.skipped == {} and dataset.skill == SKILL


def test_results_json_array_file_without_results_is_a_dataset_of_zero_results(tmp_path):
    data = write_results(tmp_path / "d", [])
    (data / "results.jsonl").unlink()
    (data / "results.json").write_text("[]")
    assert load(data).results == []


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
    # Python cannot hold these safely: a RecursionError or ValueError must not escape
    "nested_past_the_stack": b"[" * 100_000 + b"]" * 100_000,
    "nested_past_the_limit": b'[{"content": ' + b"[" * 200 + b"]" * 200 + b"}]",
    "integer_too_long": b'[{"role": "user", "content": ' + b"7" * 5000 + b"}]",
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


# ---------------------------------------------------------------- hostile results (Python's own limits)


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize("line", [
    '{"id": "b", "hard": 0, "extra": ' + deep(100_000) + "}",  # past the stack: RecursionError in json
    '{"id": "b", "hard": 0, "extra": ' + deep(200) + "}",  # within the stack, past the limit
    deep(100_000),  # the whole line (it starts like a JSON array file)
    '{"id": "b", "hard": 0, "n_turns": ' + "9" * 5000 + "}",  # past sys.get_int_max_str_digits()
])
def test_json_python_cannot_hold_is_bad_input_naming_file_and_line(tmp_path, line):
    data = write_results(tmp_path / "d", [row("a"), line] if not line.startswith("[") else [line])
    number = 1 if line.startswith("[") else 2
    message = user_error(data)
    assert f"{data / 'results.jsonl'}:{number}:" in message and "not usable JSON" in message


def test_deep_json_array_results_file_names_the_line(tmp_path):
    data = write_results(tmp_path / "d", [row("a")])
    (data / "results.jsonl").write_text('[\n{"id": "a", "hard": 0},\n{"id": "b", "hard": 0, "x": ' + deep(50_000)
                                        + "}\n]")
    message = user_error(data)
    assert f"{data / 'results.jsonl'}:3:" in message and "nested deeper than" in message


def test_nesting_within_the_limit_is_kept(tmp_path):
    nested = json.loads(deep(150))
    data = write_results(tmp_path / "d", [row("a", extra=nested)])
    (data / "predictions" / "a" / "conversation.json").write_text(json.dumps([{"role": "user", "content": nested}]))
    dataset = load(data)
    assert dataset.skipped == {}
    traj = load_trajectory(dataset, dataset.results[0])
    assert traj.fields["extra"] == nested and traj.conversation[0]["content"] == nested


def test_largest_folder_name_is_accepted(tmp_path):
    run_id = "x" * 255
    data = write_results(tmp_path / "d", [row(run_id)])
    dataset = load(data)
    assert [r.id for r in dataset.results] == [run_id] and dataset.skipped == {}


def test_id_over_the_file_systems_name_limit_names_the_line(tmp_path, monkeypatch):
    # some file systems take fewer than 255 bytes per name: the limit comes from the folder's own
    data = write_results(tmp_path / "d", [row("a"), row("b" * 120)])
    monkeypatch.setattr("reflact.inputs.dataset.os.pathconf", lambda path, name: 100)
    message = user_error(data)
    assert f"{data / 'results.jsonl'}:2" in message and "120 bytes" in message and "100" in message


def test_every_line_break_and_control_character_is_refused_in_ids():
    import unicodedata

    from reflact.inputs.dataset import check_id

    refused = 0
    for code in range(0x110000):
        char = chr(code)
        breaks = len(f"a{char}b".splitlines()) > 1
        if breaks or unicodedata.category(char) in ("Cc", "Zl", "Zp", "Cs"):
            with pytest.raises(UserError):
                check_id(f"a{char}b", "here")
            refused += 1
    assert refused == 65 + 2 + 2048  # Cc, U+2028/9, surrogates: every line break is among them
    for ordinary in ("run_1", "tâche-7", "東京", "emoji😀", "a b", "a\u200bb"):
        assert check_id(ordinary, "here") == ordinary


@pytest.mark.parametrize("value", ["inf", "nan", "0", "-1", "1e308"])
def test_max_file_mb_must_be_a_usable_positive_number(tmp_path, value):
    data = write_results(tmp_path / "d", [row("a")])
    assert "data.max_file_mb" in user_error(data, f"data.max_file_mb={value}")


# ---------------------------------------------------------------- links and special files

SECRET = "sk-test-secret-never-in-a-prompt"


def outside_file(tmp_path: Path, name: str, content: str) -> Path:
    path = tmp_path / "elsewhere" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content, encoding="utf-8")
    return path


def replace_with_link(path: Path, target: Path | str) -> None:
    if path.is_dir() and not path.is_symlink():
        for child in path.iterdir():
            child.unlink()
        path.rmdir()
    elif path.exists() or path.is_symlink():
        path.unlink()
    path.symlink_to(target)


def link_outside(tmp_path: Path, data: Path, kind: str) -> Path:
    """Make the file (or folder) of `kind` in run b's place link out of the dataset; return its path."""
    secret_conv = json.dumps([{"role": "user", "content": SECRET}])
    folder = data / "predictions" / "b"
    if kind == "conversation":
        replace_with_link(folder / "conversation.json", outside_file(tmp_path, "conv.json", secret_conv))
        return folder / "conversation.json"
    if kind == "conversation_to_proc":
        replace_with_link(folder / "conversation.json", "/proc/self/environ")
        return folder / "conversation.json"
    if kind == "run_folder":
        target = outside_file(tmp_path, "run/conversation.json", secret_conv).parent
        replace_with_link(folder, target)
        return folder / "conversation.json"
    if kind == "extras":
        replace_with_link(folder / "target_system_prompt.txt", outside_file(tmp_path, "sys.txt", SECRET))
        return folder / "target_system_prompt.txt"
    replace_with_link(folder / "spreadsheet_preview.txt", "/proc/self/environ")
    return folder / "spreadsheet_preview.txt"


LINK_KINDS = ["conversation", "conversation_to_proc", "run_folder", "extras", "extras_to_proc"]


@pytest.mark.parametrize("kind", LINK_KINDS)
def test_run_file_linking_outside_the_dataset_is_bad_input(tmp_path, kind):
    data = write_results(tmp_path / "d", [row("a"), row("b", 1)])
    path = link_outside(tmp_path, data, kind)
    message = user_error(data)
    assert str(path) in message and "links outside the dataset folder" in message
    assert "on_bad_conversation" in message and SECRET not in message


@pytest.mark.parametrize("kind", LINK_KINDS)
def test_run_file_linking_outside_is_skipped_when_asked_and_never_read(tmp_path, kind):
    data = write_results(tmp_path / "d", [row("a"), row("b", 1)])
    path = link_outside(tmp_path, data, kind)
    dataset = load(data, "data.on_bad_conversation=skip")
    assert list(dataset.skipped) == ["b"] and "links outside the dataset folder" in dataset.skipped["b"]
    assert str(path) in dataset.skipped["b"]
    shown = load_trajectory(dataset, dataset.results[0])
    assert SECRET not in json.dumps([shown.fields, shown.conversation, shown.extras])


@pytest.mark.parametrize("name,key", [("skill.md", "data.skill"), ("results.jsonl", "data.results")])
def test_file_in_data_dir_linking_outside_it_is_refused(tmp_path, name, key):
    data = write_results(tmp_path / "d", [row("a")])
    target = outside_file(tmp_path, name, (data / name).read_text(encoding="utf-8"))
    replace_with_link(data / name, target)
    message = user_error(data)
    assert str(data / name) in message and "links outside the dataset folder" in message and key in message


def test_predictions_folder_linking_outside_data_dir_is_refused(tmp_path):
    data = write_results(tmp_path / "d", [row("a")])
    (data / "predictions").rename(tmp_path / "preds")
    (data / "predictions").symlink_to(tmp_path / "preds")
    message = user_error(data)
    assert str(data / "predictions") in message and "links outside" in message and "data.predictions" in message


def test_paths_given_one_by_one_may_live_anywhere(tmp_path):
    data = write_results(tmp_path / "d", [row("a")])
    skill = outside_file(tmp_path, "skill.md", "# Skill from elsewhere\n")
    link = tmp_path / "results_link.jsonl"
    link.symlink_to(data / "results.jsonl")
    (data / "predictions").rename(tmp_path / "preds")
    dataset = load(data, f"data.skill={skill}", f"data.results={link}", f"data.predictions={tmp_path / 'preds'}")
    assert dataset.skill == "# Skill from elsewhere\n" and dataset.skipped == {}
    assert load_trajectory(dataset, dataset.results[0]).conversation == CONV


def test_files_under_given_predictions_must_not_link_out_of_it(tmp_path):
    data = write_results(tmp_path / "d", [row("a"), row("b", 1)])
    link_outside(tmp_path, data, "conversation")
    (data / "predictions").rename(tmp_path / "preds")
    message = user_error(data, f"data.predictions={tmp_path / 'preds'}")
    assert str(tmp_path / "preds" / "b" / "conversation.json") in message and "links outside" in message


def test_links_that_stay_inside_are_followed(tmp_path):
    data = write_results(tmp_path / "d", [row("a"), row("b", 1)])
    runs = data / "predictions"
    replace_with_link(runs / "b" / "conversation.json", "../a/conversation.json")
    (runs / "a" / "target_system_prompt.txt").write_text("shared prompt", encoding="utf-8")
    (runs / "b" / "target_system_prompt.txt").symlink_to(runs / "a" / "target_system_prompt.txt")
    (data / "skills").mkdir()
    (data / "skill.md").rename(data / "skills" / "v1.md")
    (data / "skill.md").symlink_to("skills/v1.md")
    linked_dir = tmp_path / "dataset_link"
    linked_dir.symlink_to(data)
    dataset = load(linked_dir)
    assert dataset.skill == SKILL and dataset.skipped == {}
    traj = load_trajectory(dataset, dataset.results[1])
    assert traj.conversation == CONV and traj.extras["target_system_prompt"] == "shared prompt"


def test_dangling_link_inside_is_a_missing_conversation(tmp_path):
    data = write_results(tmp_path / "d", [row("a")])
    replace_with_link(data / "predictions" / "a" / "conversation.json", "gone.json")
    assert load(data).skipped == {"a": "missing conversation"}


def test_link_loop_is_bad_input_not_a_missing_conversation(tmp_path):
    data = write_results(tmp_path / "d", [row("a")])
    path = data / "predictions" / "a" / "conversation.json"
    replace_with_link(path, "conversation.json")
    message = user_error(data)
    assert str(path) in message and "on_bad_conversation" in message


def special_file(path: Path, kind: str) -> None:
    if path.exists():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
        return
    try:
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # like /dev/null, inside the dataset
    except PermissionError:
        pytest.skip("creating a device file needs privileges")


@pytest.mark.parametrize("kind", ["fifo", "device"])
@pytest.mark.parametrize("name", ["conversation.json", "target_user_prompt.txt"])
def test_run_file_that_is_not_a_regular_file_is_bad_input(tmp_path, kind, name):
    data = write_results(tmp_path / "d", [row("a")])
    path = data / "predictions" / "a" / name
    special_file(path, kind)
    message = user_error(data)  # a FIFO would block a plain read forever
    assert str(path) in message and "not a regular file" in message
    assert load(data, "data.on_bad_conversation=skip").skipped == {"a": f"{path}: not a regular file"}


@pytest.mark.parametrize("name", ["skill.md", "results.jsonl"])
def test_dataset_file_that_is_not_a_regular_file_is_bad_input(tmp_path, name):
    data = write_results(tmp_path / "d", [row("a")])
    special_file(data / name, "fifo")
    message = user_error(data)
    assert str(data / name) in message and "not a regular file" in message


# ---------------------------------------------------------------- through the entry point


@pytest.mark.parametrize("make", ["deep_results_line", "skill_link_out"])
def test_hostile_input_is_a_one_line_error_with_exit_code_2(tmp_path, make):
    from tests.conftest import run_cli

    data = write_results(tmp_path / "d", [row("a"), row("b", 1)])
    if make == "deep_results_line":
        (data / "results.jsonl").write_text(row("a") + "\n" + '{"id": "b", "hard": ' + deep(100_000) + "}\n")
        names = [f"{data / 'results.jsonl'}:2"]
    else:
        replace_with_link(data / "skill.md", outside_file(tmp_path, "skill.md", SECRET))
        names = [str(data / "skill.md"), "links outside"]
    proc = run_cli(f"data.dir={data}", "optimizer.base_url=http://127.0.0.1:9", "mlflow.enabled=false",
                   f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("reflact: error:"), proc.stderr
    assert all(name in lines[0] for name in names) and SECRET not in proc.stdout + proc.stderr
