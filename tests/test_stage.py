"""The stage through the real client against the loopback server (SPEC 2)."""

from __future__ import annotations

import json
import math

import pytest

from reflact.calls.client import make_client
from reflact.inputs.dataset import load_dataset
from reflact.prompting.plan import plan_minibatches
from reflact.running.stage import Stage
from reflact.testing.optimizer_server import Response, chat_body, default_reply
from tests.conftest import make_config, stage_settings, write_dataset


def run_stage(tmp_path, server, dataset_dir, *overrides, run_dir=None):
    """The stage through the real client; the response cache is off unless a test turns it on."""
    cfg = make_config(f"data.dir={dataset_dir}", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
                      "optimizer.retry.initial_wait_s=0.01", "optimizer.cache=off", *overrides)
    dataset = load_dataset(cfg.data)
    client = make_client(cfg.optimizer, tmp_path, environ={})
    stage = Stage(stage_settings(cfg), dataset, client, run_dir or tmp_path / "run")
    return stage.run()


def test_one_call_per_minibatch_and_budget_cut(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=23, n_succ=17)
    outcomes = run_stage(tmp_path, server, data, "reflect.minibatch_size=5", "reflect.edit_budget=2")
    assert server.count == math.ceil(23 / 5) + math.ceil(17 / 5)
    assert [o.tag for o in outcomes] == [f"minibatch_fail_{i:03d}" for i in range(5)] + [
        f"minibatch_succ_{i:03d}" for i in range(4)]
    for o in outcomes:
        patch = json.loads((tmp_path / "run" / "patches" / f"{o.tag}.json").read_text())
        assert len(patch["patch"]["edits"]) == 2
        assert patch["n_proposed"] == 4  # the server proposes L + 2
        assert patch["source_type"] == o.group
        assert patch["trajectory_ids"] == o.ids and patch["n_analysed"] == len(o.ids)
        assert o.truncated == 2


@pytest.mark.parametrize("budget,kept", [(0, 0), (-1, 3)])
def test_budget_zero_keeps_none_and_negative_keeps_all(tmp_path, server, budget, kept):
    data = write_dataset(tmp_path / "d", n_fail=4, n_succ=0)
    outcomes = run_stage(tmp_path, server, data, f"reflect.edit_budget={budget}")
    assert [o.kept for o in outcomes] == [kept]


def test_every_result_in_exactly_one_minibatch_and_seeded(tmp_path):
    data = write_dataset(tmp_path / "d", n_fail=30, n_succ=21)
    cfg = make_config(f"data.dir={data}", "optimizer.base_url=http://127.0.0.1:9", "reflect.minibatch_size=4")
    results = load_dataset(cfg.data).results
    plan = plan_minibatches(results, cfg.reflect)
    ids = [r.id for mb in plan for r in mb.results]
    assert sorted(ids) == sorted(r.id for r in results)
    assert all(r.hard == 0 for mb in plan if mb.group == "failure" for r in mb.results)
    again = plan_minibatches(results, cfg.reflect)
    assert [[r.id for r in mb.results] for mb in again] == [[r.id for r in mb.results] for mb in plan]
    other = make_config(f"data.dir={data}", "optimizer.base_url=http://127.0.0.1:9", "reflect.minibatch_size=4",
                        "reflect.seed=7")
    assert [r.id for mb in plan_minibatches(results, other.reflect) for r in mb.results] != ids


def test_smaller_minibatches_refine_larger_ones(tmp_path):
    data = write_dataset(tmp_path / "d", n_fail=37, n_succ=29)
    base = [f"data.dir={data}", "optimizer.base_url=http://127.0.0.1:9"]
    results = load_dataset(make_config(*base).data).results
    plan8 = plan_minibatches(results, make_config(*base, "reflect.minibatch_size=8").reflect)
    plan4 = plan_minibatches(results, make_config(*base, "reflect.minibatch_size=4").reflect)
    for mb in plan8:
        halves = [m for m in plan4 if m.group == mb.group and m.index in (2 * mb.index, 2 * mb.index + 1)]
        assert [r.id for m in halves for r in m.results] == [r.id for r in mb.results]


def test_order_on_disk_does_not_matter(tmp_path):
    a = write_dataset(tmp_path / "a", n_fail=20, n_succ=10, seed=1)
    b = write_dataset(tmp_path / "b", n_fail=20, n_succ=10, seed=2)
    assert (a / "results.jsonl").read_text() != (b / "results.jsonl").read_text()
    plans = []
    for d in (a, b):
        cfg = make_config(f"data.dir={d}", "optimizer.base_url=http://127.0.0.1:9")
        plans.append([[r.id for r in mb.results]
                      for mb in plan_minibatches(load_dataset(cfg.data).results, cfg.reflect)])
    assert plans[0] == plans[1]


def test_success_threshold_and_failure_only(tmp_path):
    data = write_dataset(tmp_path / "d", n_fail=3, n_succ=5)
    lines = [json.loads(line) for line in (data / "results.jsonl").read_text().splitlines()]
    for row in lines:
        if row["hard"] == 1:
            row["hard"] = 0.5
    (data / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    base = [f"data.dir={data}", "optimizer.base_url=http://127.0.0.1:9", "reflect.minibatch_size=100"]
    results = load_dataset(make_config(*base).data).results
    assert [mb.group for mb in plan_minibatches(results, make_config(*base).reflect)] == ["failure", "success"]
    assert [len(mb.results)
            for mb in plan_minibatches(results, make_config(*base, "reflect.success_threshold=0.6").reflect)] == [8]
    assert [mb.group
            for mb in plan_minibatches(results, make_config(*base, "reflect.failure_only=true").reflect)] == ["failure"]


def test_resume_reuses_matching_patches_and_redoes_stale_ones(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=10, n_succ=6)
    first = run_stage(tmp_path, server, data, "reflect.minibatch_size=4")
    calls = server.count
    assert calls == len(first) == 3 + 2
    second = run_stage(tmp_path, server, data, "reflect.minibatch_size=4")
    assert server.count == calls
    assert {o.status for o in second} == {"reused"}
    assert [o.kept for o in second] == [o.kept for o in first]
    # a stale file: other L -> every minibatch redone
    run_stage(tmp_path, server, data, "reflect.minibatch_size=4", "reflect.edit_budget=1")
    assert server.count == 2 * calls
    # a changed skill makes every saved patch stale too
    (data / "skill.md").write_text("# A new skill\n")
    third = run_stage(tmp_path, server, data, "reflect.minibatch_size=4", "reflect.edit_budget=1")
    assert server.count == 3 * calls and {o.status for o in third} == {"done"}
    # one hand-damaged patch file is redone alone
    (tmp_path / "run" / "patches" / "minibatch_succ_001.json").write_text('{"fingerprint": "x"')
    run_stage(tmp_path, server, data, "reflect.minibatch_size=4", "reflect.edit_budget=1")
    assert server.count == 3 * calls + 1


def test_reask_after_unparsable_reply_then_success(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=3, n_succ=0)

    def script(request, number):
        if number == 1:
            return Response(body=chat_body("Sure! Here are my thoughts, {no json} sorry"))
        return None

    server.script = script
    [outcome] = run_stage(tmp_path, server, data)
    assert outcome.status == "done" and outcome.reasks == 1 and outcome.calls == 2
    reask = server.requests[1]["messages"]
    assert reask[2]["role"] == "assistant" and "could not be used" in reask[3]["content"]
    assert (tmp_path / "run" / "calls" / outcome.tag / "reply_1.txt").read_text().startswith("Sure!")


def test_invalid_replies_exhaust_reasks_and_are_recorded(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=3, n_succ=3)
    bad = {"patch": {"reasoning": "x", "edits": [{"op": "replace", "content": "no target"}]}}
    server.script = lambda request, number: Response(body=chat_body(json.dumps(bad)))
    outcomes = run_stage(tmp_path, server, data, "reflect.max_reasks=1")
    assert server.count == 2 * len(outcomes)
    for o in outcomes:
        assert o.status == "failed" and "target" in o.error
        assert not (tmp_path / "run" / "patches" / f"{o.tag}.json").exists()
        saved = json.loads((tmp_path / "run" / "calls" / o.tag / "outcome.json").read_text())
        assert saved["status"] == "failed" and (tmp_path / "run" / "calls" / o.tag / "reply_2.txt").exists()
    # the failed minibatches are redone on the next run
    server.script = None
    again = run_stage(tmp_path, server, data, "reflect.max_reasks=1")
    assert {o.status for o in again} == {"done"}


def test_skipped_runs_are_counted_and_all_skipped_minibatch_makes_no_call(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=4, n_succ=3, missing=2, empty=2)
    outcomes = run_stage(tmp_path, server, data, "reflect.minibatch_size=2", "reflect.failure_only=true")
    assert sum(o.skipped for o in outcomes) == 4
    assert [o.status for o in outcomes] == ["skipped", "skipped"]
    assert server.count == 0


def test_skill_aware_notes_are_normalised(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=2)
    run_stage(tmp_path, server, data, "reflect.skill_aware.enabled=true")
    patch = json.loads((tmp_path / "run" / "patches" / "minibatch_fail_000.json").read_text())
    assert patch["appendix_notes"] == ["Follow the verification rule.", "Check units."]


def test_lapse_only_failure_reply_becomes_empty_patch_with_notes(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=0)
    server.script = lambda r, n: Response(body=chat_body(json.dumps({"appendix_notes": "Re-read rule 2."})))
    [o] = run_stage(tmp_path, server, data, "reflect.skill_aware.enabled=true")
    patch = json.loads((tmp_path / "run" / "patches" / f"{o.tag}.json").read_text())
    assert o.status == "done" and patch["patch"]["edits"] == [] and patch["appendix_notes"] == ["Re-read rule 2."]


@pytest.mark.parametrize("mode,key,kept", [
    ("rewrite", "revise_suggestions", 2),
    ("suggestions", "revise_suggestions", 2),
    ("full_rewrite", "skill_candidates", 1),
    ("edits", "edits", 2),
])
def test_modes_and_aliases(tmp_path, server, mode, key, kept):
    data = write_dataset(tmp_path / "d", n_fail=3, n_succ=0)
    [o] = run_stage(tmp_path, server, data, f"reflect.update_mode={mode}", "reflect.edit_budget=2")
    patch = json.loads((tmp_path / "run" / "patches" / f"{o.tag}.json").read_text())
    assert len(patch["patch"][key]) == kept == o.kept


def test_full_rewrite_gets_the_larger_token_allowance(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=1, n_succ=0)
    run_stage(tmp_path, server, data, "reflect.update_mode=full_rewrite",
              "optimizer.max_output_tokens=100", "optimizer.max_output_tokens_full_rewrite=5000")
    run_stage(tmp_path, server, data, "optimizer.max_output_tokens=100", run_dir=tmp_path / "run2")
    assert [r["max_completion_tokens"] for r in server.requests] == [5000, 100]


def test_optional_decoding_parameters_are_sent_only_when_set(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=1, n_succ=0)
    run_stage(tmp_path, server, data)
    run_stage(tmp_path, server, data, "optimizer.temperature=0.3", "optimizer.reasoning_effort=low",
              "optimizer.token_limit_param=max_tokens", run_dir=tmp_path / "run2")
    plain, tuned = server.requests
    assert "temperature" not in plain and "reasoning_effort" not in plain
    assert tuned["temperature"] == 0.3 and tuned["reasoning_effort"] == "low" and "max_tokens" in tuned


def test_results_return_in_deterministic_order_whatever_finishes_first(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=12, n_succ=12)
    # earlier minibatches answer slower, so calls finish in reverse order
    server.script = lambda r, n: Response(body=chat_body(json.dumps(default_reply(r))),
                                          delay_s=max(0.0, 0.3 - 0.05 * n))
    outcomes = run_stage(tmp_path, server, data, "reflect.minibatch_size=4", "reflect.workers=6")
    assert [o.tag for o in outcomes] == [f"minibatch_fail_{i:03d}" for i in range(3)] + [
        f"minibatch_succ_{i:03d}" for i in range(3)]


def test_the_client_is_made_on_the_launching_thread_before_a_second_prompt(tmp_path, server):
    """The SDK is imported alone on the GIL: by the thread that prepares the prompts, once the first
    minibatch needs a call and before it prepares the next (on a worker, beside that preparing,
    both take longer). Made once, whatever the number of workers."""
    import threading

    from reflact.calls.deferred import Deferred

    data = write_dataset(tmp_path / "d", n_fail=12, n_succ=0)
    cfg = make_config(f"data.dir={data}", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
                      "optimizer.cache=off", "reflect.minibatch_size=2", "reflect.workers=4")
    made = []

    def make():
        made.append((threading.current_thread().name, sorted(p.name for p in (tmp_path / "run" / "calls").iterdir())))
        return make_client(cfg.optimizer, tmp_path, environ={})

    outcomes = Stage(stage_settings(cfg), load_dataset(cfg.data), Deferred(make), tmp_path / "run").run()
    assert made == [(threading.current_thread().name, ["minibatch_fail_000"])]
    assert [o.status for o in outcomes] == ["done"] * 6 and server.count == 6
