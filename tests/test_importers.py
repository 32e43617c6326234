"""Importers: tau-bench and chat JSONL logs become dataset folders that load (SPEC 1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from reflact.config import DataConfig
from reflact.core.errors import UserError
from reflact.inputs.dataset import load_dataset, parse_conversation
from reflact.inputs.importers import import_runs, main

PROJECT = Path(__file__).resolve().parent.parent
POLICY = "# Airline policy\n- Confirm before booking.\n"


def call(call_id, name, arguments):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def tau_run(task_id, reward, trial=0, system=POLICY, **extra):
    traj = [
        {"role": "system", "content": system},
        {"role": "user", "content": f"Book a flight please (task {task_id})."},
        {"role": "assistant", "content": None, "tool_calls": [call("c1", "get_user", '{"user_id":"mia"}')]},
        {"role": "tool", "tool_call_id": "c1", "name": "get_user", "content": '{"name": "Mia"}'},
        {
            "role": "assistant",
            "content": "Let me search.",
            "tool_calls": [call("c2", "search", '{"from":"JFK"}'), call("c3", "search", '{"from":"EWR"}')],
        },
        # replies out of order: pairing is by id, not position
        {"role": "tool", "tool_call_id": "c3", "name": "search", "content": "[]"},
        {"role": "tool", "tool_call_id": "c2", "name": "search", "content": '["HAT1"]'},
        # a reused call id (tau-bench's own files do this) pairs with the call still waiting
        {"role": "assistant", "content": None, "tool_calls": [call("c1", "book", '{"f":"HAT1"}')]},
        {"role": "tool", "tool_call_id": "c1", "name": "book", "content": "ok"},
        {"role": "assistant", "content": "Booked."},
    ]
    run = {"task_id": task_id, "reward": reward, "info": {"task": {"instruction": "You are mia."}}, "traj": traj}
    if trial is not None:
        run["trial"] = trial
    run.update(extra)
    return run


def write_json_file(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path


def write_lines(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def results_of(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text(encoding="utf-8").splitlines()]


# ---------------------------------------------------------------- taubench


def test_taubench_import_loads_as_a_dataset(tmp_path):
    src = write_json_file(tmp_path / "tau.json", [tau_run(3, 0.0), tau_run(3, 1.0, trial=1), tau_run(7, 1)])
    out = tmp_path / "ds"
    assert main(["taubench", str(src), str(out)]) == 0
    dataset = load_dataset(DataConfig(dir=str(out)))
    assert dataset.skill == POLICY
    assert [(r.id, r.hard) for r in dataset.results] == [
        ("task3_trial0", 0.0),
        ("task3_trial1", 1.0),
        ("task7_trial0", 1.0),
    ]
    assert dataset.skipped == {}
    first = dataset.results[0].fields
    assert first["task_description"] == "Book a flight please (task 3)."
    assert first["task_type"] == "tau-bench"
    assert first["n_turns"] == 4
    assert first["info"] == {"task": {"instruction": "You are mia."}}
    assert "target_system_prompt" not in first


def test_taubench_conversation_pairs_tool_calls_with_replies(tmp_path):
    src = write_json_file(tmp_path / "tau.json", [tau_run(1, 0.0)])
    out = tmp_path / "ds"
    import_runs("taubench", src, out)
    conversation = parse_conversation(out / "predictions" / "task1_trial0" / "conversation.json")
    assert conversation == [
        {"role": "user", "content": "Book a flight please (task 1)."},
        {"type": "tool_call", "cmd": 'get_user({"user_id":"mia"})', "obs": '{"name": "Mia"}'},
        {"role": "assistant", "content": "Let me search."},
        {"type": "tool_call", "cmd": 'search({"from":"JFK"})', "obs": '["HAT1"]'},
        {"type": "tool_call", "cmd": 'search({"from":"EWR"})', "obs": "[]"},
        {"type": "tool_call", "cmd": 'book({"f":"HAT1"})', "obs": "ok"},
        {"role": "assistant", "content": "Booked."},
    ]


def test_taubench_without_trial_numbers_runs_of_a_task(tmp_path):
    src = write_json_file(tmp_path / "tau.json", [tau_run(5, 0, trial=None), tau_run(5, 1, trial=None)])
    imported = import_runs("taubench", src, tmp_path / "ds")
    assert [run.id for run in imported.runs] == ["task5_trial0", "task5_trial1"]


def test_taubench_skill_is_the_most_common_system_message(tmp_path, capsys):
    runs = [tau_run(1, 0, system="odd"), tau_run(2, 1), tau_run(3, 0)]
    src = write_json_file(tmp_path / "tau.json", runs)
    out = tmp_path / "ds"
    assert main(["taubench", str(src), str(out)]) == 0
    assert (out / "skill.md").read_text(encoding="utf-8") == POLICY
    err = capsys.readouterr().err
    assert "reflact: warning:" in err and "1 of 3 runs" in err
    odd = next(r for r in results_of(out) if r["id"] == "task1_trial0")
    assert odd["target_system_prompt"] == "odd"


def test_summary_line_counts_failures_and_successes(tmp_path, capsys):
    src = write_json_file(tmp_path / "tau.json", [tau_run(1, 0.0), tau_run(2, 0.5), tau_run(3, 1)])
    out = tmp_path / "ds"
    main(["taubench", str(src), str(out)])
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"reflact: wrote 3 runs to {out} (1 failures, 2 successes)"]


# ---------------------------------------------------------------- chat_jsonl


def chat_line(score, run_id=None, system="You are a careful analyst.", **extra):
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": [{"type": "text", "text": "Sum column B."}]},
        {"role": "assistant", "content": "", "tool_calls": [call("t1", "python", {"code": "sum(b)"})]},
        {"role": "tool", "tool_call_id": "t1", "content": "42"},
        {"role": "assistant", "content": "The sum is 42."},
    ]
    line = {"messages": messages, "score": score, **extra}
    if run_id is not None:
        line["id"] = run_id
    return line


def test_chat_jsonl_import_loads_as_a_dataset(tmp_path):
    src = write_lines(
        tmp_path / "runs.jsonl",
        [chat_line(0, "alpha", task="Sum B", fail_reason="wrong cell"), "", chat_line(1)],
    )
    out = tmp_path / "ds"
    assert main(["chat_jsonl", str(src), str(out)]) == 0
    dataset = load_dataset(DataConfig(dir=str(out)))
    assert dataset.skill == "You are a careful analyst."
    by_id = {r.id: r for r in dataset.results}
    assert sorted(by_id) == ["alpha", "run_3"]  # the default id uses the file's line number
    assert by_id["alpha"].hard == 0.0 and by_id["run_3"].hard == 1.0
    assert by_id["alpha"].fields["task_description"] == "Sum B"
    assert by_id["alpha"].fields["fail_reason"] == "wrong cell"
    assert by_id["run_3"].fields["task_description"] == "Sum column B."
    assert by_id["run_3"].fields["n_turns"] == 2
    conversation = parse_conversation(dataset.conversation_path("alpha"))
    assert conversation == [
        {"role": "user", "content": "Sum column B."},
        {"type": "tool_call", "cmd": 'python({"code": "sum(b)"})', "obs": "42"},
        {"role": "assistant", "content": "The sum is 42."},
    ]


def test_chat_jsonl_skill_comes_from_the_first_line_or_is_empty(tmp_path):
    src = write_lines(tmp_path / "a.jsonl", [chat_line(1, "a", system="first"), chat_line(0, "b", system="second")])
    imported = import_runs("chat_jsonl", src, tmp_path / "ds")
    assert imported.skill == "first"
    assert imported.runs[1].result["target_system_prompt"] == "second"
    bare = {"messages": [{"role": "user", "content": "hi"}], "score": 1}
    src = write_lines(tmp_path / "b.jsonl", [bare])
    out = tmp_path / "ds2"
    imported = import_runs("chat_jsonl", src, out)
    assert (out / "skill.md").read_text(encoding="utf-8") == ""
    assert any("no system message" in w for w in imported.warnings)


def test_unanswered_call_orphan_reply_and_late_system_message_are_kept(tmp_path):
    messages = [
        {"role": "system", "content": "part one"},
        {"role": "system", "content": "part two"},
        {"role": "user", "content": "go"},
        {"role": "assistant", "tool_calls": [call("x", "ls", "")]},
        {"role": "tool", "tool_call_id": "other", "content": "stray"},
        {"role": "system", "content": "late system text"},
        {"role": "assistant", "content": None, "function_call": {"name": "pwd", "arguments": "{}"}},
        {"role": "function", "name": "pwd", "content": "/home"},
    ]
    src = write_lines(tmp_path / "r.jsonl", [{"id": "r", "messages": messages, "score": 0}])
    imported = import_runs("chat_jsonl", src, tmp_path / "ds")
    assert imported.skill == "part one\n\npart two"
    assert imported.runs[0].conversation == [
        {"role": "user", "content": "go"},
        {"type": "tool_call", "cmd": "ls()", "obs": ""},
        {"role": "tool", "content": "stray"},
        {"role": "system_note", "content": "late system text"},
        {"type": "tool_call", "cmd": "pwd({})", "obs": "/home"},
    ]


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "fmt, content, message",
    [
        ("taubench", "[{\"task_id\": 1,", "tau.in:1: not JSON"),
        ("taubench", '{"task_id": 1}', "expected a JSON list of tau-bench runs, got dict"),
        ("taubench", "[]", "no runs in the file"),
        ("taubench", "[3]", "item 1: a run must be a JSON object"),
        ("taubench", json.dumps([{"task_id": 1, "traj": []}]),
         "item 1: 'reward' must be a number (the run's score), got missing"),
        ("taubench", json.dumps([{"task_id": 1, "reward": "1", "traj": []}]),
         "item 1: 'reward' must be a number (the run's score), got '1'"),
        ("taubench", json.dumps([{"task_id": 1, "reward": True, "traj": []}]), "'reward' must be a number"),
        ("taubench", json.dumps([{"task_id": 1, "reward": 1}]), "item 1: run has no 'traj'"),
        ("taubench", json.dumps([{"reward": 1, "traj": []}]), "item 1: run has no 'task_id'"),
        ("taubench", json.dumps([{"task_id": "../x", "reward": 1, "traj": []}]),
         "item 1: unsafe id 'task../x_trial0'"),
        ("taubench", json.dumps([{"task_id": 1, "reward": 1, "traj": {}}]),
         "item 1, traj: expected a list of chat messages"),
        ("taubench", json.dumps([{"task_id": 1, "reward": 1, "traj": [{"content": "x"}]}]),
         "item 1, traj, message 1: message has no 'role'"),
        (
            "taubench",
            json.dumps([{"task_id": 1, "trial": 0, "reward": 1, "traj": []},
                        {"task_id": 1, "trial": 0, "reward": 0, "traj": []}]),
            "item 2: duplicate id 'task1_trial0' (first at",
        ),
        ("chat_jsonl", '{"messages": [], "score": 1}\nnot json\n', "tau.in:2: not JSON"),
        ("chat_jsonl", "[1, 2]\n", "tau.in:1: a run must be a JSON object, got list"),
        ("chat_jsonl", '{"messages": []}\n', "tau.in:1: 'score' must be a number (the run's score), got missing"),
        ("chat_jsonl", '{"messages": [], "score": null}\n', "'score' must be a number (the run's score), got None"),
        ("chat_jsonl", '{"messages": [], "score": NaN}\n', "'score' must be a number"),
        ("chat_jsonl", '{"score": 1}\n', "tau.in:1: run has no 'messages'"),
        ("chat_jsonl", '{"id": "a/b", "messages": [], "score": 1}\n', "tau.in:1: unsafe id 'a/b'"),
        ("chat_jsonl", '{"id": "", "messages": [], "score": 1}\n', "tau.in:1: unsafe id ''"),
        (
            "chat_jsonl",
            '{"id": "a", "messages": [], "score": 1}\n{"id": "a", "messages": [], "score": 0}\n',
            "tau.in:2: duplicate id 'a' (first at ",
        ),
        ("chat_jsonl", "\n\n", "no runs in the file"),
    ],
)
def test_bad_input_is_a_clear_error_and_writes_nothing(tmp_path, fmt, content, message):
    src = tmp_path / "tau.in"
    src.write_text(content, encoding="utf-8")
    out = tmp_path / "ds"
    with pytest.raises(UserError) as info:
        import_runs(fmt, src, out)
    assert message in str(info.value)
    assert "\n" not in str(info.value)
    assert not out.exists()


def test_non_utf8_input(tmp_path):
    src = tmp_path / "bad.jsonl"
    src.write_bytes(b'{"messages": [], "score": 1, "task": "caf\xe9"}\n')
    with pytest.raises(UserError, match=r"bad.jsonl: not UTF-8 text \(byte 41\)"):
        import_runs("chat_jsonl", src, tmp_path / "ds")


def test_missing_input_file(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        import_runs("taubench", tmp_path / "absent.json", tmp_path / "ds")


def test_existing_dataset_is_refused_unless_forced(tmp_path):
    src = write_json_file(tmp_path / "tau.json", [tau_run(1, 0)])
    out = tmp_path / "ds"
    import_runs("taubench", src, out)
    with pytest.raises(UserError, match="already holds a dataset .results.jsonl.; pass --force"):
        import_runs("taubench", src, out)
    write_json_file(src, [tau_run(2, 1)])
    import_runs("taubench", src, out, force=True)
    assert [r["id"] for r in results_of(out)] == ["task2_trial0"]


def test_output_path_that_is_a_file(tmp_path):
    src = write_json_file(tmp_path / "tau.json", [tau_run(1, 0)])
    with pytest.raises(UserError, match="exists and is not a folder"):
        import_runs("taubench", src, src)


def test_cli_error_is_one_stderr_line_and_exit_code_2(tmp_path):
    src = tmp_path / "runs.jsonl"
    src.write_text('{"id": "x", "messages": [], "score": "high"}\n', encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "reflact.importers", "chat_jsonl", str(src), str(tmp_path / "ds")],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"reflact: error: {src}:1: 'score' must be a number (the run's score), got 'high'"
    ]


def test_cli_help_works(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "reflact.importers", "--help"], cwd=PROJECT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0
    assert "taubench" in proc.stdout and "chat_jsonl" in proc.stdout and "--force" in proc.stdout
