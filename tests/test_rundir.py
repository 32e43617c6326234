"""Reading the run dir back on resume (SPEC 2.7): a file damaged on disk is redone, never a crash."""

from __future__ import annotations

import copy
import json

import pytest

from reflact.calls.protocol import Usage
from reflact.running.outcome import Outcome
from reflact.running.reuse import reused
from reflact.running.rundir import RunDir
from tests.conftest import write_dataset
from tests.test_stage import run_stage

TAG = "minibatch_fail_000"
FP = "f" * 64
PATCH = {
    "failure_summary": [{"pattern": "p"}],
    "patch": {"reasoning": "why", "edits": [{"op": "append", "content": "rule"}]},
    "source_type": "failure",
    "trajectory_ids": ["a", "b"],
    "n_analysed": 2,
    "n_proposed": 3,
    "fingerprint": FP,
}


def fresh() -> Outcome:
    return Outcome(tag=TAG, group="failure", index=0, ids=["a", "b"])


def saved_run_dir(tmp_path) -> RunDir:
    """A run dir holding one good patch and its record (4 tokens of each kind, $0.25, one re-ask)."""
    run_dir = RunDir(tmp_path / "run")
    made = fresh()
    made.usage, made.cost_usd, made.reasks, made.latency_s = Usage(4, 4, 4, 4), 0.25, 1, 2.5
    run_dir.save_patch(made, PATCH)
    return run_dir


def mangled(changes: dict, drop: tuple = ()) -> dict:
    patch = copy.deepcopy(PATCH)
    for key in drop:
        patch.pop(key)
    for key, value in changes.items():
        if key.startswith("patch."):
            patch["patch"][key.removeprefix("patch.")] = value
        else:
            patch[key] = value
    return patch


def test_a_well_formed_patch_and_record_are_reused_with_their_figures(tmp_path):
    run_dir, outcome = saved_run_dir(tmp_path), fresh()
    assert reused(run_dir, outcome, FP, "edits") == PATCH
    assert (outcome.status, outcome.proposed, outcome.kept) == ("reused", 3, 1)
    assert (outcome.usage, outcome.cost_usd, outcome.reasks, outcome.latency_s) == (Usage(4, 4, 4, 4), 0.25, 1, 2.5)


DAMAGED_PATCHES = {
    "n_proposed a string": mangled({"n_proposed": "3"}),
    "n_proposed a word": mangled({"n_proposed": "three"}),
    "n_proposed missing": mangled({}, drop=("n_proposed",)),
    "n_proposed null": mangled({"n_proposed": None}),
    "n_proposed negative": mangled({"n_proposed": -1}),
    "n_proposed a fraction": mangled({"n_proposed": 2.5}),
    "n_proposed a boolean": mangled({"n_proposed": True}),
    "fewer proposed than kept": mangled({"n_proposed": 0}),
    "patch a list": mangled({"patch": [{"op": "append"}]}),
    "patch a string": mangled({"patch": "edits"}),
    "patch missing": mangled({}, drop=("patch",)),
    "payload an object": mangled({"patch.edits": {"op": "append", "content": "x"}}),
    "payload a number": mangled({"patch.edits": 7}),
    "payload a string": mangled({"patch.edits": "append a rule"}),
    "payload missing": mangled({"patch.edits": None}),
    "item not an object": mangled({"patch.edits": ["append a rule"]}),
    "item with an unknown op": mangled({"patch.edits": [{"op": "rewrite", "content": "x"}]}),
    "item without its target": mangled({"patch.edits": [{"op": "replace", "content": "x"}]}),
    "fingerprint a number": mangled({"fingerprint": 5}),
    "fingerprint a list": mangled({"fingerprint": [FP]}),
    "fingerprint missing": mangled({}, drop=("fingerprint",)),
}


@pytest.mark.parametrize("damaged", list(DAMAGED_PATCHES.values()), ids=list(DAMAGED_PATCHES))
def test_a_damaged_patch_is_redone_not_a_crash(tmp_path, damaged):
    run_dir, outcome = saved_run_dir(tmp_path), fresh()
    run_dir.patch_path(TAG).write_text(json.dumps(damaged))
    assert reused(run_dir, outcome, FP, "edits") is None
    assert outcome.status == "done" and (outcome.proposed, outcome.kept) == (0, 0)


@pytest.mark.parametrize(
    "text",
    ["[" * 100_000, "[]", "null", '"patch"', "{", "\xff"],
    ids=["nested too deep", "a list", "null", "a string", "cut short", "not utf-8"],
)
def test_a_patch_file_that_is_no_patch_object_is_redone(tmp_path, text):
    run_dir = saved_run_dir(tmp_path)
    run_dir.patch_path(TAG).write_bytes(text.encode("utf-8") if text != "\xff" else b"\xff{}")
    assert run_dir.patch(TAG) is None and reused(run_dir, fresh(), FP, "edits") is None


def test_a_patch_checked_against_another_modes_schema_is_redone(tmp_path):
    run_dir = saved_run_dir(tmp_path)
    wrong = mangled({"patch.revise_suggestions": [{"op": "append", "content": "x"}]})
    run_dir.patch_path(TAG).write_text(json.dumps(wrong))
    assert reused(run_dir, fresh(), FP, "revise_suggestions") is None


DAMAGED_RECORDS = {
    "usage a list": {"usage": [1, 2]},
    "usage a string": {"usage": "12 tokens"},
    "usage count a string": {"usage": {"prompt": "12"}},
    "usage count a fraction": {"usage": {"completion": 1.5}},
    "usage count negative": {"usage": {"prompt": -3}},
    "usage unknown field": {"usage": {"prompt": 1, "bogus": 2}},
    "cost a string": {"cost_usd": "0.25"},
    "cost not a number": {"cost_usd": float("nan")},
    "cost infinite": {"cost_usd": float("inf")},
    "cost negative": {"cost_usd": -1},
    "reasks a fraction": {"reasks": 1.5},
    "reasks null": {"reasks": None},
    "latency an object": {"latency_s": {"s": 1}},
}


@pytest.mark.parametrize("damage", list(DAMAGED_RECORDS.values()), ids=list(DAMAGED_RECORDS))
def test_a_damaged_record_is_read_as_missing_and_the_patch_still_reused(tmp_path, damage):
    run_dir, outcome = saved_run_dir(tmp_path), fresh()
    record = run_dir.call_dir(TAG) / "outcome.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), **damage}))
    assert run_dir.outcome_record(TAG) is None
    assert reused(run_dir, outcome, FP, "edits") == PATCH and outcome.status == "reused"
    assert (outcome.usage, outcome.cost_usd, outcome.reasks, outcome.latency_s) == (Usage(), 0.0, 0, 0.0)


@pytest.mark.parametrize("text", ["[]", "7", "{", "[" * 100_000], ids=["a list", "a number", "cut short", "too deep"])
def test_a_record_that_is_no_object_is_read_as_missing(tmp_path, text):
    run_dir = saved_run_dir(tmp_path)
    (run_dir.call_dir(TAG) / "outcome.json").write_text(text)
    outcome = fresh()
    assert reused(run_dir, outcome, FP, "edits") == PATCH and outcome.cost_usd == 0.0


def test_a_record_with_fields_missing_counts_them_as_zero(tmp_path):
    run_dir = saved_run_dir(tmp_path)
    (run_dir.call_dir(TAG) / "outcome.json").write_text(json.dumps({"usage": {"prompt": 7}, "cost_usd": 1}))
    outcome = fresh()
    reused(run_dir, outcome, FP, "edits")
    assert (outcome.usage, outcome.cost_usd, outcome.reasks) == (Usage(prompt=7), 1.0, 0)


def test_a_rerun_redoes_only_the_damaged_patch_and_finishes(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=4, n_succ=4)
    first = run_stage(tmp_path, server, data, "reflect.minibatch_size=2")
    calls = server.count
    patches = tmp_path / "run" / "patches"
    damaged = json.loads((patches / "minibatch_fail_001.json").read_text())
    damaged["n_proposed"], damaged["patch"] = "many", ["not", "an", "object"]
    (patches / "minibatch_fail_001.json").write_text(json.dumps(damaged))
    record = tmp_path / "run" / "calls" / "minibatch_succ_000" / "outcome.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "usage": {"prompt": "lots"}}))
    second = run_stage(tmp_path, server, data, "reflect.minibatch_size=2")
    assert server.count == calls + 1
    assert {o.tag: o.status for o in second} == {
        o.tag: "done" if o.tag == "minibatch_fail_001" else "reused" for o in first
    }
    assert json.loads((patches / "minibatch_fail_001.json").read_text())["n_proposed"] == first[1].proposed


def test_trace_records_keep_each_requests_latest_and_leave_damage_out(tmp_path):
    """traces.jsonl as a rerun and relog read it: a request redone is its latest record, a line cut
    by a kill or not an object is skipped, a record without its messages is left out, and only the
    minibatches asked for are read back, in the order they were written."""
    from reflact.calls.protocol import Reply, Usage
    from reflact.running.events import Replied
    from reflact.running.rundir import TraceRecords, append_trace, recorded_requests, trace_record

    run_dir = RunDir(tmp_path)
    reply = Reply("{}", "stop", Usage(prompt=10, completion=2), 1.5, started_at=100.0)
    first = Replied("minibatch_fail_000", 0, [{"role": "user", "content": "café"}], None, "HTTP 500", ended_at=101.0)
    again = Replied("minibatch_fail_000", 0, [{"role": "user", "content": "café"}], reply, cost_usd=0.01,
                    ended_at=102.0)
    other = Replied("minibatch_fail_001", 0, [{"role": "user", "content": "b"}], reply, ended_at=103.0)
    offsets = [append_trace(run_dir, trace_record(event)) for event in (first, other, again)]
    with open(tmp_path / "traces.jsonl", "a") as handle:
        handle.write('{"tag": "minibatch_fail_002", "number": 0, "ended_at": 1}\n')  # no messages
        handle.write("[1, 2]\n")
        handle.write('{"tag": "minibatch_fail_003", "number": 0, "mess')  # cut by a kill
    records = TraceRecords(run_dir)
    assert recorded_requests(records.of({"minibatch_fail_000"})) == [again]
    assert recorded_requests(records.of()) == [other, again]
    assert [r["tag"] for r in records.of()] == ["minibatch_fail_001", "minibatch_fail_000", "minibatch_fail_002"]
    assert TraceRecords(RunDir(tmp_path / "none")).of() == []
    # each record where append_trace said it starts (the tracker reads a request from there)
    assert recorded_requests(records.at(offsets[::-1])) == [again, other, first]
    assert TraceRecords(RunDir(tmp_path / "none")).at(offsets) == []
