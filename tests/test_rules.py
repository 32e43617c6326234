"""The rules of SPEC.md pinned one at a time, so that a one-line change to any of them fails a test:
seeds, boundaries, the fingerprint's fields, every run count, the context-window reserve, what a
redo removes, tags and order. Each test says which rule it holds; most run in-process in well
under a second (the loopback server of reflact/testing/optimizer_server.py answers)."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from reflact.calls.protocol import DryRunEstimator
from reflact.config import parts as config_parts
from reflact.core.modes import get_mode
from reflact.inputs.dataset import Dataset, load_dataset
from reflact.orchestration.experiment import Launch, run_experiment
from reflact.prompting.messages import Prompt
from reflact.prompting.plan import Minibatch, plan_minibatches
from reflact.replies.patches import CheckedReply, merge_replies
from reflact.running.outcome import Outcome
from reflact.running.rundir import RunDir, fingerprint
from reflact.running.stage import Stage
from reflact.running.summary import counts, run_status
from reflact.testing.optimizer_server import Response, chat_body, default_reply
from tests.conftest import (
    SKILL,
    long_dataset,
    make_config,
    run_context,
    shape_of,
    stage_for,
    stage_settings,
    write_dataset,
)

OFFLINE = "optimizer.base_url=http://127.0.0.1:9"  # never called: the plan and prompts only
SHOWN_IDS = re.compile(r"^### Trajectory \d+ of \d+ \(id: (.+)\)$", re.M)


def scored_dataset(root: Path, scores: dict[str, float]) -> Path:
    """A dataset folder whose runs have exactly these scores (one short conversation each)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "skill.md").write_text(SKILL, encoding="utf-8")
    rows = [{"id": run_id, "hard": hard, "task_description": f"task {run_id}"} for run_id, hard in scores.items()]
    (root / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    for run_id in scores:
        folder = root / "predictions" / run_id
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "conversation.json").write_text(json.dumps([{"role": "user", "content": run_id}]))
    return root


def plan_of(data: Path, *overrides: str) -> list[Minibatch]:
    cfg = make_config(f"data.dir={data}", OFFLINE, *overrides)
    return plan_minibatches(load_dataset(cfg.data).results, cfg.reflect)



def dry_stage(data: Path, run_dir: Path, *overrides: str) -> Stage:
    """The stage with the dry-run estimator: every prompt built and written, nothing called."""
    cfg = make_config(f"data.dir={data}", OFFLINE, *overrides)
    return Stage(stage_settings(cfg), load_dataset(cfg.data), DryRunEstimator(1500), run_dir)


# ---------------------------------------------------------------- SPEC 2.3: the seeded shuffles


def seeded(ids: list[str], seed: int) -> list[str]:
    """The permutation SPEC 2.3 prescribes: the group sorted by id, shuffled by random.Random(seed)."""
    order = sorted(ids)
    random.Random(seed).shuffle(order)
    return order


@pytest.mark.parametrize("seed", [0, 42])
def test_failures_are_shuffled_with_the_seed_and_successes_with_seed_plus_one(tmp_path, seed):
    data = write_dataset(tmp_path / "d", n_fail=13, n_succ=11)
    fail_ids = [f"run_{i:05d}" for i in range(13)]
    succ_ids = [f"run_{i:05d}" for i in range(13, 24)]
    # meaningful: each group's order tells seed, seed + 1 and seed + 2 apart
    assert len({tuple(seeded(fail_ids, s)) for s in (seed, seed + 1)}) == 2
    assert len({tuple(seeded(succ_ids, s)) for s in (seed, seed + 1, seed + 2)}) == 3
    plan = plan_of(data, f"reflect.seed={seed}", "reflect.minibatch_size=5")
    assert [i for mb in plan if mb.group == "failure" for i in mb.ids] == seeded(fail_ids, seed)
    assert [i for mb in plan if mb.group == "success" for i in mb.ids] == seeded(succ_ids, seed + 1)
    # consecutive cuts of at most M, indexed from 0 in each group
    assert [(mb.group, mb.index, len(mb.ids)) for mb in plan] == [
        ("failure", 0, 5), ("failure", 1, 5), ("failure", 2, 3), ("success", 0, 5), ("success", 1, 5),
        ("success", 2, 1)]


def test_each_prompt_shows_its_minibatch_in_plan_order(tmp_path):
    data = write_dataset(tmp_path / "d", n_fail=9, n_succ=7)
    stage = dry_stage(data, tmp_path / "run", "reflect.minibatch_size=4")
    outcomes = stage.run()
    plan = plan_of(data, "reflect.minibatch_size=4")
    assert [o.tag for o in outcomes] == [mb.tag for mb in plan]
    for mb in plan:
        user = RunDir(tmp_path / "run").user_path(mb.tag, 1).read_text(encoding="utf-8")
        assert SHOWN_IDS.findall(user) == mb.ids
        heading = "Failed" if mb.group == "failure" else "Successful"
        assert f"## {heading} Trajectories ({len(mb.ids)} total)" in user


# ---------------------------------------------------------------- SPEC 1.1: failure or success


def groups(data: Path, *overrides: str) -> dict[str, str]:
    """id -> the group the plan put it in."""
    return {i: mb.group for mb in plan_of(data, "reflect.minibatch_size=100", *overrides) for i in mb.ids}


def test_a_score_equal_to_the_threshold_is_a_success_and_just_below_a_failure(tmp_path):
    below = math.nextafter(0.5, 0.0)
    data = scored_dataset(tmp_path / "d", {"at": 0.5, "below": below, "above": math.nextafter(0.5, 1.0),
                                           "zero": 0.0, "one": 1.0})
    assert groups(data, "reflect.success_threshold=0.5") == {
        "at": "success", "below": "failure", "above": "success", "zero": "failure", "one": "success"}


def test_the_default_threshold_makes_only_zero_scores_failures(tmp_path):
    data = scored_dataset(tmp_path / "d", {"zero": 0.0, "negative": -1.0, "tiny": 1e-9, "small": 1e-6,
                                           "partial": 0.25, "one": 1.0})
    assert groups(data) == {"zero": "failure", "negative": "failure", "tiny": "success", "small": "success",
                            "partial": "success", "one": "success"}
    # the summary counts with the same rule
    cfg = make_config(f"data.dir={data}", OFFLINE)
    run_counts = counts(cfg.reflect, True, load_dataset(cfg.data), [], 0.0)
    assert (run_counts["results"], run_counts["failures"], run_counts["successes"]) == (6, 2, 4)


def test_failure_only_keeps_the_failures_at_the_boundary_and_counts_no_successes(tmp_path):
    data = scored_dataset(tmp_path / "d", {"at": 0.5, "below": math.nextafter(0.5, 0.0), "zero": 0.0})
    overrides = ("reflect.success_threshold=0.5", "reflect.failure_only=true")
    assert groups(data, *overrides) == {"below": "failure", "zero": "failure"}
    cfg = make_config(f"data.dir={data}", OFFLINE, *overrides)
    run_counts = counts(cfg.reflect, True, load_dataset(cfg.data), [], 0.0)
    assert (run_counts["results"], run_counts["failures"], run_counts["successes"]) == (3, 2, 0)
    # the MLflow dataset's profile counts as summary.json does (it once counted 1 success here)
    assert logged_profile(tmp_path, cfg) == {"results": 3, "failures": 2, "successes": 0, "skipped": 0}


def logged_profile(tmp_path: Path, cfg) -> dict:
    """The profile the MLflow mirror gives the run's dataset input."""
    from reflact.running.rundir import RunDir
    from reflact.tracking.mirror import log_dataset

    class Store:
        def log_dataset(self, name, digest, source, profile):
            self.profile = profile

    store = Store()
    context = run_context(cfg, params={}, run_dir=RunDir(tmp_path / "run"), launch_dir=tmp_path, started_at=0.0)
    log_dataset(store, context, load_dataset(cfg.data))
    return store.profile


# ---------------------------------------------------------------- SPEC 2.6 and 2.8: tags and order


@pytest.mark.parametrize("group,index,tag", [
    ("failure", 0, "minibatch_fail_000"), ("failure", 7, "minibatch_fail_007"), ("success", 42, "minibatch_succ_042"),
    ("success", 999, "minibatch_succ_999"), ("failure", 1000, "minibatch_fail_1000"),
])
def test_a_minibatch_tag_is_its_group_and_three_digit_index(group, index, tag):
    assert Minibatch(group, index, []).tag == tag


def test_the_plan_is_failures_by_index_then_successes_by_index(tmp_path):
    data = write_dataset(tmp_path / "d", n_fail=23, n_succ=5)
    plan = plan_of(data, "reflect.minibatch_size=2")
    assert [mb.tag for mb in plan] == [f"minibatch_fail_{i:03d}" for i in range(12)] + [
        f"minibatch_succ_{i:03d}" for i in range(3)]
    outcomes = dry_stage(data, tmp_path / "run", "reflect.minibatch_size=2").run()
    assert [o.tag for o in outcomes] == [mb.tag for mb in plan]
    written = sorted(p.name for p in (tmp_path / "run" / "calls").iterdir())
    assert written == sorted(mb.tag for mb in plan)


# ---------------------------------------------------------------- SPEC 2.7 / behaviour 7.1: the fingerprint

FP_BASE = ("data.dir=unused", OFFLINE, "optimizer.model=m1", "optimizer.temperature=0.2",
           "optimizer.reasoning_effort=low", "optimizer.sample=0", "reflect.edit_budget=4", "reflect.update_mode=patch")
MESSAGES = [{"role": "system", "content": "the analyst template"}, {"role": "user", "content": "the skill and runs"}]
# each one changes only the setting named, never the messages
FP_FIELDS = {
    "model": "optimizer.model=m2",
    "mode": "reflect.update_mode=rewrite",
    "L": "reflect.edit_budget=5",
    "L unlimited": "reflect.edit_budget=-1",
    "temperature": "optimizer.temperature=0.3",
    "temperature unset": "optimizer.temperature=null",
    "reasoning_effort": "optimizer.reasoning_effort=high",
    "reasoning_effort unset": "optimizer.reasoning_effort=null",
    "sample": "optimizer.sample=1",
}
# settings that do not shape the call: the same messages keep the same fingerprint
FP_OUTSIDE = {
    "workers": "reflect.workers=7",
    "max_reasks": "reflect.max_reasks=0",
    "structured_output": "optimizer.structured_output=off",
    "max_output_tokens": "optimizer.max_output_tokens=100",
    "token_limit_param": "optimizer.token_limit_param=max_tokens",
    "base_url": "optimizer.base_url=http://127.0.0.1:10/v1",
    "retry": "optimizer.retry.max_attempts=1",
    "cache": "optimizer.cache=off",
    "timeout": "optimizer.timeout_s=5",
    "mode alias": "reflect.update_mode=edits",
}


@pytest.mark.parametrize("change", list(FP_FIELDS.values()), ids=list(FP_FIELDS))
def test_every_setting_of_the_fingerprint_changes_it(change):
    base = fingerprint(shape_of(make_config(*FP_BASE)), MESSAGES)
    assert fingerprint(shape_of(make_config(*FP_BASE, change)), MESSAGES) != base


@pytest.mark.parametrize("change", list(FP_OUTSIDE.values()), ids=list(FP_OUTSIDE))
def test_settings_outside_the_fingerprint_leave_it_alone(change):
    base = fingerprint(shape_of(make_config(*FP_BASE)), MESSAGES)
    assert fingerprint(shape_of(make_config(*FP_BASE, change)), MESSAGES) == base


def test_both_messages_and_every_part_are_in_the_fingerprint():
    cfg = make_config(*FP_BASE)
    base = fingerprint(shape_of(cfg), MESSAGES)
    system, user = MESSAGES
    assert fingerprint(shape_of(cfg), [{**system, "content": "another template"}, user]) != base
    assert fingerprint(shape_of(cfg), [system, {**user, "content": "another skill"}]) != base
    split = Prompt([MESSAGES, [system, {**user, "content": "the second half"}]])
    assert split.messages == [*MESSAGES, system, {**user, "content": "the second half"}]
    assert fingerprint(shape_of(cfg), split.messages) != base
    assert fingerprint(shape_of(cfg), [dict(m) for m in MESSAGES]) == base  # a function of the values only


def test_a_saved_patch_carries_the_fingerprint_of_its_settings_and_written_prompt(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=3, n_succ=0)
    stage = stage_for(tmp_path, server, data, "optimizer.temperature=0.4", "optimizer.sample=2")
    [outcome] = stage.run()
    run_dir = RunDir(tmp_path / "run")
    sent = [{"role": "system", "content": run_dir.system_path(outcome.tag).read_text(encoding="utf-8")},
            {"role": "user", "content": run_dir.user_path(outcome.tag, 1).read_text(encoding="utf-8")}]
    assert server.requests[0]["messages"] == sent
    assert json.loads(run_dir.patch_path(outcome.tag).read_text())["fingerprint"] == fingerprint(stage.shape, sent)


# a rerun with one change: (override, is the patch redone?)
RERUNS = {
    "model": ("optimizer.model=test-2", True),
    "temperature": ("optimizer.temperature=0.7", True),
    "reasoning_effort": ("optimizer.reasoning_effort=high", True),
    "sample": ("optimizer.sample=1", True),
    "L": ("reflect.edit_budget=3", True),
    "mode": ("reflect.update_mode=rewrite", True),
    "system message": ("prompts.error=You are a careful analyst of failed runs.", True),
    "user message": ("reflect.step_buffer=Step 1 tried a stricter refund rule.", True),
    "workers": ("reflect.workers=3", False),
    "max_reasks": ("reflect.max_reasks=0", False),
    "structured_output": ("optimizer.structured_output=off", False),
    "max_output_tokens": ("optimizer.max_output_tokens=2000", False),
    "retry": ("optimizer.retry.max_attempts=2", False),
}


@pytest.mark.parametrize("change,redone", list(RERUNS.values()), ids=list(RERUNS))
def test_a_rerun_redoes_the_patch_exactly_when_the_fingerprint_changes(tmp_path, server, change, redone):
    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=0)
    base = ("optimizer.temperature=0.2", "optimizer.reasoning_effort=low")
    [first] = stage_for(tmp_path, server, data, *base).run()
    assert first.status == "done" and server.count == 1
    [again] = stage_for(tmp_path, server, data, *base, change).run()
    assert (again.status, server.count) == (("done", 2) if redone else ("reused", 1))


# ---------------------------------------------------------------- behaviour 3.6: the context window's reserve


def fitted(data: Path, run_dir: Path, window: int, allowance: int, *overrides: str):
    """(parts, shortened) of the one minibatch's prompt with this window and output allowance."""
    key = "max_output_tokens_full_rewrite" if "reflect.update_mode=full_rewrite" in overrides else "max_output_tokens"
    [outcome] = dry_stage(data, run_dir, f"optimizer.context_window={window}", f"optimizer.{key}={allowance}",
                          *overrides).run()
    return outcome.parts, outcome.shortened


def tokens_of(run_dir: Path, tag: str) -> int:
    """The estimate SPEC'd for a prompt: its characters / 4, rounded down."""
    rd = RunDir(run_dir)
    chars = len(rd.system_path(tag).read_text(encoding="utf-8")) + len(rd.user_path(tag, 1).read_text(encoding="utf-8"))
    return chars // 4


def boundary(tokens: int, least_allowance: int) -> tuple[int, int]:
    """(allowance, window) such that tokens + allowance is exactly 90 % of the window."""
    allowance = least_allowance + (-(tokens + least_allowance)) % 9
    return allowance, (tokens + allowance) // 9 * 10


@pytest.mark.parametrize("mode", ["patch", "full_rewrite"])
def test_a_prompt_fits_when_it_and_the_output_allowance_are_at_most_90_percent_of_the_window(tmp_path, mode):
    data = write_dataset(tmp_path / "d", n_fail=4, n_succ=0)
    overrides = (f"reflect.update_mode={mode}",)
    [outcome] = dry_stage(data, tmp_path / "plain", *overrides).run()
    tokens = tokens_of(tmp_path / "plain", outcome.tag)
    allowance, window = boundary(tokens, 1000)
    assert (tokens + allowance) * 10 == 9 * window
    # just fitting: one untouched call
    assert fitted(data, tmp_path / "at", window, allowance, *overrides) == (1, 0)
    # one token less of window, or one more of allowance: it no longer fits (split, or shortened)
    for run, (w, a) in {"window": (window - 1, allowance), "allowance": (window, allowance + 1)}.items():
        parts, shortened = fitted(data, tmp_path / run, w, a, *overrides)
        assert (parts, shortened > 0) == ((1, True) if mode == "full_rewrite" else (2, False))


def test_a_split_is_logged_with_its_sizes(tmp_path, caplog):
    data = write_dataset(tmp_path / "d", n_fail=5, n_succ=0)
    [outcome] = dry_stage(data, tmp_path / "plain", "reflect.minibatch_size=5").run()
    tokens = tokens_of(tmp_path / "plain", outcome.tag)
    allowance, window = boundary(tokens, 1000)
    with caplog.at_level("INFO", logger="reflact"):
        assert fitted(data, tmp_path / "split", window - 1, allowance, "reflect.minibatch_size=5")[0] == 2
    assert (f"minibatch_fail_000: ~{tokens} prompt tokens do not fit optimizer.context_window={window - 1}; "
            "splitting 5 trajectories into 3 + 2") in caplog.messages


def test_the_other_modes_allowance_does_not_count_against_the_window(tmp_path):
    data = write_dataset(tmp_path / "d", n_fail=4, n_succ=0)
    [outcome] = dry_stage(data, tmp_path / "plain").run()
    allowance, window = boundary(tokens_of(tmp_path / "plain", outcome.tag), 1000)
    assert fitted(data, tmp_path / "a", window, allowance, f"optimizer.max_output_tokens_full_rewrite={window + 1}",
                  ) == (1, 0)


# ---------------------------------------------------------------- behaviour 7.1: a redo starts clean


def test_a_redo_removes_the_earlier_replies_parts_and_patch(tmp_path, server):
    data = long_dataset(tmp_path / "d", n_fail=4, obs_chars=8000)
    window = ("optimizer.context_window=8000", "optimizer.max_output_tokens=1000")
    server.script = lambda request, number: Response(body=chat_body("no JSON here")) if number == 1 else None
    [first] = stage_for(tmp_path, server, data, *window).run()
    folder = tmp_path / "run" / "calls" / first.tag
    names = {p.name for p in folder.iterdir()}
    assert first.status == "done" and first.parts == 2 and first.reasks == 1
    assert {"user_2.md", "reply_1.txt", "reply_2.txt", "reply_3.txt"} <= names
    # redone with one part (no window) and one reply: nothing of the first attempt is left
    server.script = None
    [second] = stage_for(tmp_path, server, data).run()
    assert second.status == "done"
    assert {p.name for p in folder.iterdir()} == {"system.md", "user.md", "reply_1.txt", "outcome.json"}
    # a redo that fails leaves no patch of the other settings behind, and none of its replies
    server.script = lambda request, number: Response(status=400, body={"error": {"message": "bad request"}})
    [third] = stage_for(tmp_path, server, data, "optimizer.temperature=0.9").run()
    assert third.status == "failed"
    assert not RunDir(tmp_path / "run").patch_path(third.tag).exists()
    assert {p.name for p in folder.iterdir()} == {"system.md", "user.md", "outcome.json"}


def test_a_reused_patch_keeps_its_files(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=0)
    server.script = lambda request, number: Response(body=chat_body("no JSON here")) if number == 1 else None
    [first] = stage_for(tmp_path, server, data).run()
    folder = tmp_path / "run" / "calls" / first.tag
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    [again] = stage_for(tmp_path, server, data).run()
    assert again.status == "reused" and {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert RunDir(tmp_path / "run").patch_path(first.tag).is_file()


# ---------------------------------------------------------------- SPEC 2.6: the cut


def part(edits: list[str], reasoning: str, **fields) -> CheckedReply:
    obj = {**fields, "patch": {"reasoning": reasoning, "edits": [{"op": "append", "content": e} for e in edits]}}
    return CheckedReply(obj=obj, proposed=len(edits) + 1, kept=len(edits))


@pytest.mark.parametrize("budget,kept", [(3, ["a1", "b1", "a2"]), (-1, ["a1", "b1", "a2", "b2", "b3"]), (0, [])])
def test_merged_parts_interleave_their_items_then_cut_to_l(budget, kept):
    parts = [part(["a1", "a2"], "first", failure_summary=[{"failure_type": "x"}], note="kept from the first"),
             part(["b1", "b2", "b3"], "second", failure_summary=[{"failure_type": "y"}], note="dropped")]
    merged = merge_replies(parts, get_mode("patch"), budget)
    assert [e["content"] for e in merged.obj["patch"]["edits"]] == kept
    assert (merged.proposed, merged.kept) == (3 + 4, len(kept))
    assert merged.obj["patch"]["reasoning"] == "first\n\nsecond"
    assert merged.obj["failure_summary"] == [{"failure_type": "x"}, {"failure_type": "y"}]
    assert merged.obj["note"] == "kept from the first" and merged.obj["parts"] == 2


@pytest.mark.parametrize("budget", [0, -1, 1])
def test_a_full_rewrite_patch_keeps_its_candidate_whatever_l(tmp_path, server, budget):
    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=0)
    [o] = stage_for(tmp_path, server, data, "reflect.update_mode=full_rewrite", f"reflect.edit_budget={budget}").run()
    patch = json.loads(RunDir(tmp_path / "run").patch_path(o.tag).read_text())
    assert len(patch["patch"]["skill_candidates"]) == 1 and (o.proposed, o.kept, o.truncated) == (1, 1, 0)
    assert "## Update Format" in server.requests[0]["messages"][1]["content"]


@pytest.mark.parametrize("budget,kept", [(-1, 6), (-5, 6), (0, 0), (1, 1), (4, 4), (6, 6), (7, 6)])
def test_the_saved_patch_holds_the_first_l_items(tmp_path, server, budget, kept):
    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=0)
    edits = [{"op": "append", "content": f"- rule {i}"} for i in range(6)]
    server.script = lambda r, n: Response(body=chat_body(json.dumps({"patch": {"reasoning": "r", "edits": edits}})))
    [o] = stage_for(tmp_path, server, data, f"reflect.edit_budget={budget}").run()
    patch = json.loads(RunDir(tmp_path / "run").patch_path(o.tag).read_text())
    assert patch["patch"]["edits"] == edits[:kept] and patch["n_proposed"] == 6
    assert (o.proposed, o.kept, o.truncated) == (6, kept, 6 - kept)


# ---------------------------------------------------------------- behaviour 7.3: every count of summary.json

# every reply's usage: distinct figures, so that no count can stand in for another
USAGE = {"prompt": 300, "cached": 70, "completion": 40, "reasoning": 9}
# USD per million tokens; fresh input is free so that a request's worst case does not depend on its
# prompt's length (the cost cap's boundary below is then exact)
PRICE = "+optimizer.prices.test={input:0,cached_input:1,output:2}"
REPLY_COST = (70 * 1 + 40 * 2) / 1e6
ALLOWANCE = 1000
WORST = ALLOWANCE * 2 / 1e6  # what a request may cost at most
# the kept edits (L = 6) would apply 2, fall back 1 and skip 3; 4 more are cut
EDITS = [
    {"op": "append", "content": "- Re-read the amount."},
    {"op": "replace", "target": "Look up the order before acting on it.", "content": "- Look up the order first."},
    {"op": "insert_after", "target": "no such line", "content": "- Check units."},
    {"op": "replace", "target": "no such rule", "content": "x"},
    {"op": "delete", "target": "- Never refund an order with an open dispute."},
    {"op": "delete", "target": "absent"},
    *({"op": "append", "content": f"- extra {i}"} for i in range(4)),
]


def counted_body(text: str) -> dict:
    body = chat_body(text, prompt_tokens=USAGE["prompt"], completion_tokens=USAGE["completion"])
    body["usage"]["prompt_tokens_details"]["cached_tokens"] = USAGE["cached"]
    body["usage"]["completion_tokens_details"]["reasoning_tokens"] = USAGE["reasoning"]
    return body


def good_reply(request: dict) -> Response:
    reply = default_reply(request)
    reply["patch"] = {"reasoning": "amounts", "edits": EDITS}
    return Response(body=counted_body(json.dumps(reply)))


def change_conversation(data: Path, run_id: str, remove: bool = False) -> None:
    path = data / "predictions" / run_id / "conversation.json"
    if remove:
        path.unlink()
    else:
        path.write_text(json.dumps([{"role": "user", "content": f"a changed conversation of {run_id}"}]))


def test_every_count_of_the_summary_has_its_own_known_value(tmp_path, server):
    """Nine minibatches, each ending another way: reused (2), skipped, done after two retries and a
    re-ask, failed after retries, done from the response cache (2), done with a run skipped, and
    not run for the cost cap."""
    data = write_dataset(tmp_path / "d", n_fail=18, n_succ=9)
    common = [f"data.dir={data}", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
              "optimizer.cache=read_write", f"optimizer.cache_path={tmp_path / 'cache.db'}",
              "optimizer.retry.initial_wait_s=0.01", "optimizer.retry.max_wait_s=0.02",
              "optimizer.retry.max_attempts=3", f"optimizer.max_output_tokens={ALLOWANCE}", PRICE,
              "reflect.minibatch_size=3", "reflect.edit_budget=6", "reflect.workers=1", "mlflow.enabled=false"]
    run_dir = tmp_path / "run"
    server.script = lambda request, number: good_reply(request)
    first = run_experiment(config_parts(make_config(*common)), {}, run_dir, Launch(tmp_path))
    assert first.summary["counts"]["minibatches_done"] == 9

    tag_ids = {mb.tag: mb.ids for mb in plan_of(data, "reflect.minibatch_size=3")}
    for run_id in tag_ids["minibatch_fail_002"]:
        change_conversation(data, run_id, remove=True)  # all three skipped
    change_conversation(data, tag_ids["minibatch_succ_001"][0], remove=True)  # one of three skipped
    for tag in ("minibatch_fail_003", "minibatch_fail_004", "minibatch_succ_002"):
        change_conversation(data, tag_ids[tag][1])  # new prompts: stale patches, cache misses
    for tag in ("minibatch_fail_005", "minibatch_succ_000"):
        RunDir(run_dir).patch_path(tag).unlink()  # the same prompts: answered by the cache
    tag_of = {run_id: tag for tag, ids in tag_ids.items() for run_id in ids}
    seen: dict[str, int] = {}

    def script(request, number):
        tag = tag_of[SHOWN_IDS.findall(request["messages"][1]["content"])[0]]
        seen[tag] = seen.get(tag, 0) + 1
        if tag == "minibatch_fail_003" and seen[tag] <= 2:
            return Response(status=500, body={"error": {"message": "busy"}})
        if tag == "minibatch_fail_003" and seen[tag] == 3:
            return Response(body=counted_body("Let me think about {this} first."))
        if tag == "minibatch_fail_004":
            return Response(status=503, body={"error": {"message": "overloaded"}})
        return good_reply(request)

    server.script, before = script, server.count
    # room for the requests up to minibatch_succ_001's, not for minibatch_succ_002's (workers=1: in plan order)
    cap = WORST + 2.5 * REPLY_COST
    capped = make_config(*common, f"optimizer.max_cost_usd={cap}")
    result = run_experiment(config_parts(capped), {}, run_dir, Launch(tmp_path))
    summary = result.summary
    assert result.status == "FINISHED"
    assert server.count - before == 4 + 3 + 1  # fail_003: 2 retried + 2 answered; fail_004: 3 attempts; succ_001
    assert seen == {"minibatch_fail_003": 4, "minibatch_fail_004": 3, "minibatch_succ_001": 1}
    assert [mb["status"] for mb in summary["minibatches"]] == [
        "reused", "reused", "skipped", "done", "failed", "done", "done", "done", "not_run"]
    n_replies, n_calls, n_patches = 2 + 2 + 1 + 1 + 1, 3, 6
    c = summary["counts"]
    assert isinstance(c.pop("wall_time_s"), float)
    assert c == {
        "results": 27, "failures": 18, "successes": 9, "skipped": 4, "minibatches": 9,
        "minibatches_done": 4, "minibatches_reused": 2, "minibatches_failed": 1, "minibatches_skipped": 1,
        "minibatches_not_run": 1, "minibatches_dry_run": 0,
        "calls": n_calls, "failed_calls": 1, "reasks": 1, "retries": 2 + 2, "cache_hits": 2,
        "edits_proposed": 10 * n_patches, "edits_kept": 6 * n_patches, "edits_truncated": 4 * n_patches,
        "tokens_prompt": 300 * n_replies, "tokens_cached": 70 * n_replies, "tokens_completion": 40 * n_replies,
        "tokens_reasoning": 9 * n_replies,
        "cost_usd": pytest.approx(REPLY_COST * n_replies), "spent_usd": pytest.approx(REPLY_COST * n_calls),
        "edits_applied": 2 * n_patches, "edits_fallback": 1 * n_patches, "edits_skipped": 3 * n_patches,
        "apply_share": 0.5,
    }
    assert sorted(summary["skipped"]) == sorted([*tag_ids["minibatch_fail_002"], tag_ids["minibatch_succ_001"][0]])
    records = {mb["tag"]: mb for mb in summary["minibatches"]}
    figures = ("calls", "failed_calls", "reasks", "retries", "cache_hits", "analysed", "skipped", "kept")
    assert {tag: tuple(records[tag][k] for k in figures) for tag in records} == {
        "minibatch_fail_000": (0, 0, 0, 0, 0, 3, 0, 6),
        "minibatch_fail_001": (0, 0, 0, 0, 0, 3, 0, 6),
        "minibatch_fail_002": (0, 0, 0, 0, 0, 0, 3, 0),
        "minibatch_fail_003": (2, 0, 1, 2, 0, 3, 0, 6),
        "minibatch_fail_004": (0, 1, 0, 2, 0, 3, 0, 0),
        "minibatch_fail_005": (0, 0, 0, 0, 1, 3, 0, 6),
        "minibatch_succ_000": (0, 0, 0, 0, 1, 3, 0, 6),
        "minibatch_succ_001": (1, 0, 0, 0, 0, 2, 1, 6),
        "minibatch_succ_002": (0, 0, 0, 0, 0, 3, 0, 0),
    }
    assert [records[tag]["truncated"] for tag in records] == [4, 4, 0, 4, 0, 4, 4, 4, 0]
    assert records["minibatch_fail_003"]["apply"] == {"applied": 2, "fallback": 1, "skipped": 3, "total": 6,
                                                      "apply_share": 0.5}
    assert records["minibatch_succ_002"]["error"] == "cost limit reached"
    assert records["minibatch_fail_003"]["spent_usd"] == pytest.approx(2 * REPLY_COST)
    assert records["minibatch_fail_005"]["spent_usd"] == 0 and records["minibatch_fail_005"]["cost_usd"] > 0


def test_a_dry_run_counts_its_minibatches_as_dry_run_and_spends_nothing(tmp_path, monkeypatch):
    import reflact.running.ask as ask

    clock = iter(range(10**6))  # a slow machine: the asker's every reading a second later
    monkeypatch.setattr(ask, "time", SimpleNamespace(monotonic=lambda: float(next(clock))))
    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=5, missing=2)
    cfg = make_config(f"data.dir={data}", "optimizer=dry_run", "optimizer.model=test", "reflect.minibatch_size=2",
                      "+optimizer.prices.test={input:1,cached_input:0,output:2}", "mlflow.enabled=false")
    c = run_experiment(config_parts(cfg), {}, tmp_path / "run", Launch(tmp_path)).summary["counts"]
    # failures 000 (both runs missing); successes 000, 001, 002
    assert (c["minibatches"], c["minibatches_dry_run"], c["minibatches_skipped"], c["skipped"]) == (4, 3, 1, 2)
    assert (c["calls"], c["cache_hits"], c["spent_usd"], c["edits_proposed"]) == (0, 0, 0, 0)
    assert c["tokens_completion"] == 3 * 1500 and c["tokens_prompt"] > 0
    assert c["cost_usd"] == pytest.approx((c["tokens_prompt"] * 1 + c["tokens_completion"] * 2) / 1e6, abs=1e-6)
    # nothing was sent, so nothing was timed: two dry runs write the same outcomes
    assert {json.loads(p.read_text())["latency_s"] for p in (tmp_path / "run" / "calls").glob("*/outcome.json")} == {0}


def test_a_rewrite_run_lists_its_kept_items_and_has_no_apply_counts(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=3, n_succ=2)
    cfg = make_config(f"data.dir={data}", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
                      "optimizer.cache=off", "reflect.update_mode=rewrite", "reflect.edit_budget=2",
                      "mlflow.enabled=false")
    summary = run_experiment(config_parts(cfg), {}, tmp_path / "run", Launch(tmp_path)).summary
    rows = list(RunDir(tmp_path / "run").kept_items())
    assert [(r["minibatch"], r["position"], r["item"]["title"]) for r in rows] == [
        ("minibatch_fail_000", 0, "s0"), ("minibatch_fail_000", 1, "s1"),
        ("minibatch_succ_000", 0, "s0"), ("minibatch_succ_000", 1, "s1")]
    assert all("apply" not in r for r in rows)
    c = summary["counts"]
    assert (c["edits_proposed"], c["edits_kept"], c["edits_truncated"]) == (8, 4, 4)
    assert not {"edits_applied", "edits_fallback", "edits_skipped", "apply_share"} & set(c)
    assert not (tmp_path / "run" / "preview").exists()


def status_of(*statuses: str, dry_run: bool = False, allow_failed: bool = True) -> tuple[str, str]:
    """run_status for minibatches that ended so (a failed one with the error 'boom')."""
    cfg = make_config("data.dir=unused", OFFLINE, f"reflect.allow_failed_minibatches={allow_failed}",
                      *(["optimizer=dry_run"] if dry_run else []))
    outcomes = [Outcome(tag=f"minibatch_fail_{i:03d}", group="failure", index=i, ids=[], status=s,
                        error="boom" if s == "failed" else "") for i, s in enumerate(statuses)]
    dataset = Dataset(skill="", results=[], predictions=Path("."), max_bytes=1)
    run_counts = counts(cfg.reflect, True, dataset, outcomes, 0.0)
    return run_status(run_counts, cfg.reflect, cfg.optimizer, outcomes, Path("the-run"))


def test_the_run_fails_when_no_minibatch_made_a_patch_or_a_failure_is_not_allowed():
    status, why = status_of("failed", "not_run", "skipped")
    assert status == "FAILED" and why.startswith(
        "no minibatch produced a patch (1 failed, 1 not run; first error: boom)")
    assert "hydra.run.dir=the-run" in why
    assert status_of("not_run")[0] == "FAILED"
    status, why = status_of("done", "failed", allow_failed=False)
    assert status == "FAILED" and why.startswith(
        "1 minibatch(es) failed and reflect.allow_failed_minibatches=false; first error: boom; rerun")
    for fine in [("done", "failed"), ("reused", "failed", "not_run"), ("skipped", "skipped"), ()]:
        assert status_of(*fine) == ("FINISHED", ""), fine
    assert status_of("dry_run", "dry_run", dry_run=True) == ("FINISHED", "")
    assert status_of("done", "skipped", allow_failed=False) == ("FINISHED", "")


# ---------------------------------------------------------------- behaviour 8: the key in error texts

KEY = "sk-test-" + "Zq9" * 8  # long enough that its last 8 characters are redacted too


@pytest.mark.parametrize("echo", [KEY, KEY[-8:]], ids=["whole key", "its last 8 characters"])
def test_a_key_a_server_echoes_is_redacted_in_every_record_of_the_run(tmp_path, server, monkeypatch, echo):
    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=0)
    server.script = lambda r, n: Response(status=401, body={"error": {"message": f"bad key {echo} given"}})
    cfg = make_config(f"data.dir={data}", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
                      "optimizer.cache=off", "mlflow.enabled=false")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    result = run_experiment(config_parts(cfg), {}, tmp_path / "run", Launch(tmp_path))
    assert server.authorizations == [f"Bearer {KEY}"]  # meaningful: the key was sent, and echoed back
    [record] = result.summary["minibatches"]
    assert record["error"].startswith("HTTP 401") and record["error"].endswith(" bad key *** given")
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file():
            assert KEY[-8:].encode() not in path.read_bytes(), path
