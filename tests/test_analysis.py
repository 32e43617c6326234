"""How stable, how redundant and how well-founded a run's items are (issue #14): matching items on
hand-made sets, repeated draws (files, fingerprints, seeds, cache, resume, cost cap, dry run),
provenance (positions to ids, re-asks, prompts unchanged when off), the run's analysis.json and
its MLflow metrics, the sweep report's new columns and `python -m reflact.analyze`."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from rapidfuzz import fuzz

from reflact.analysis import matching
from reflact.analysis.figures import Item, Run, analyse, load_run, seed_agreement
from reflact.analysis.matching import item_key, match, match_chunks, normalise
from reflact.calls.protocol import DryRunEstimator
from reflact.config import parts as config_parts
from reflact.core.errors import UserError
from reflact.core.groups import FAILURE, GROUPS
from reflact.core.modes import MODES, SUPPORT_FIELD, reply_schema
from reflact.orchestration.experiment import Launch, run_experiment
from reflact.prompting.prompts import load_template, resolve_system_prompts
from reflact.replies.patches import check_reply
from reflact.replies.provenance import with_support_ids
from reflact.running.rundir import fingerprint
from reflact.sweeps.grid_report import add_seed_agreement, grid_rows, write_table
from reflact.testing.optimizer_server import Response, chat_body, default_reply, seeded_items
from tests.conftest import PROJECT, make_config, run_cli, write_dataset
from tests.conftest import stage_for as shared_stage_for

PATCH = MODES["patch"]
DEFAULT = 0.85  # analysis.match_threshold


def matches(a: dict, b: dict, threshold: float = DEFAULT) -> bool:
    pairs = [tuple(sorted((int(x), int(y)))) for xs, ys in match_chunks([item_key(a), item_key(b)], threshold)
             for x, y in zip(xs, ys, strict=True)]
    return pairs == [(0, 1)]


def score(a: str, b: str) -> float:
    return fuzz.ratio(normalise(a), normalise(b)) / 100


# 1. matching on hand-made edit sets -------------------------------------------------------------

RULE = "- Check the order status before issuing a refund."
REWORDED = {  # a light rewording: case and spaces, word order, one word, a few words
    "case": "-  check the ORDER status before issuing a refund.",
    "order": "- Before issuing a refund, check the order status.",
    "one word": "- Check the order status before you issue a refund.",
}
LIGHT = ("- When a search returns a disambiguation page, search the exact title listed.",
         "- If search returns a disambiguation page, search for the exact title it lists.")
NEGATION = ("- Always ask for the order id first.", "- Never ask for the order id first.")
DIFFERENT = ("- Verify the order's state prior to refunding.",  # the same idea in other words
             "- Check the refund amount is in cents before calling refund().")


def test_identical_edits_match_whatever_the_case_and_spacing():
    edit = {"op": "insert_after", "target": "## Orders", "content": RULE}
    assert matches(edit, dict(edit))
    assert matches(edit, {"op": "insert_after", "target": "##  ORDERS ", "content": REWORDED["case"]})


@pytest.mark.parametrize("name", sorted(REWORDED))
def test_reworded_edits_match(name):
    assert matches({"op": "append", "content": RULE}, {"op": "append", "content": REWORDED[name]})


def test_the_default_threshold_sits_between_a_light_rewording_and_a_negation():
    assert 0.85 < score(*LIGHT) < 0.9 and matches({"op": "append", "content": LIGHT[0]},
                                                   {"op": "append", "content": LIGHT[1]})
    assert 0.8 < score(*NEGATION) < 0.85
    assert not matches({"op": "append", "content": NEGATION[0]}, {"op": "append", "content": NEGATION[1]})
    # matching is lexical: other words for the same rule, or a related rule, do not match
    for other in DIFFERENT:
        assert score(RULE, other) < 0.7
        assert not matches({"op": "append", "content": RULE}, {"op": "append", "content": other})
    # a stricter threshold refuses the light rewording; a looser one accepts the negation
    assert not matches({"op": "append", "content": LIGHT[0]}, {"op": "append", "content": LIGHT[1]}, 0.9)
    assert matches({"op": "append", "content": NEGATION[0]}, {"op": "append", "content": NEGATION[1]}, 0.8)


def test_the_same_content_at_another_target_does_not_match():
    a = {"op": "insert_after", "target": "## Orders", "content": RULE}
    assert not matches(a, {**a, "target": "## Refunds"})
    assert not matches({"op": "replace", "target": "- Look up the order before acting on it.", "content": RULE},
                       {"op": "replace", "target": "- Amounts passed to refund() are in cents.", "content": RULE})
    # append has no target: one given is ignored, as when the edit is applied
    assert matches({"op": "append", "content": RULE}, {"op": "append", "target": "anything", "content": RULE})


def test_the_same_text_with_another_op_does_not_match():
    assert not matches({"op": "append", "content": RULE}, {"op": "insert_after", "target": "## Orders",
                                                           "content": RULE})
    assert not matches({"op": "replace", "target": RULE, "content": ""}, {"op": "delete", "target": RULE})
    # a delete is its target
    assert matches({"op": "delete", "target": RULE}, {"op": "delete", "target": REWORDED["order"]})


def test_suggestions_match_on_type_title_and_instruction_and_candidates_on_their_summary():
    s = {"type": "clarify", "title": "Refund order", "motivation": "x", "instruction": RULE, "priority_hint": "high"}
    assert matches(s, {**s, "motivation": "something else entirely", "priority_hint": "low"})
    assert matches(s, {**s, "instruction": REWORDED["order"]})
    assert not matches(s, {**s, "type": "add_rule"})
    assert not matches(s, {**s, "title": "Escalate disputes"})
    c = {"title": "A", "change_summary": ["tightened the refund rule", "added a status check"], "new_skill": "x"}
    assert matches(c, {**c, "title": "B", "new_skill": "y"})
    assert not matches(c, {**c, "change_summary": ["rewrote the greeting"]})


def test_chunked_matching_finds_exactly_the_pairs_a_full_comparison_finds(monkeypatch):
    """Small chunks and a length window must not lose or invent a pair."""
    rng = random.Random(3)
    words = ["order", "refund", "status", "check", "before", "after", "the", "a", "cents", "amount", "id",
             "customer", "dispute", "escalate", "never", "always", "ask", "first", "shipped", "policy"]
    texts = []
    for _ in range(240):
        base = " ".join(rng.choice(words) for _ in range(rng.randint(1, 14)))
        texts.append(base if rng.random() < 0.6 or not texts else rng.choice(texts) + rng.choice(["", " x", "s"]))
    keys = [item_key({"op": rng.choice(["append", "delete"]), "content": t, "target": t}) for t in texts]
    monkeypatch.setattr(matching, "CELLS_PER_CHUNK", 500)  # chunks of 16 rows
    for threshold in (0.5, 0.85, 1.0):
        found = {(min(a, b), max(a, b)) for xs, ys in match_chunks(keys, threshold)
                 for a, b in zip(xs.tolist(), ys.tolist(), strict=True)}
        expected = {(i, j) for i in range(len(keys)) for j in range(i + 1, len(keys))
                    if keys[i].block == keys[j].block
                    and fuzz.ratio(keys[i].texts[0], keys[j].texts[0]) >= threshold * 100}
        assert found == expected and found


def test_clusters_link_matches_transitively_and_labels_say_where_an_item_recurs():
    a, b, c = "- check order status before refund", "- check the order status before refund", "- refund in cents"
    keys = [item_key({"op": "append", "content": t}) for t in (a, b, c, a)]
    # same = group, other = minibatch: item 3 repeats item 0 in another minibatch
    m = match(keys, DEFAULT, {"elsewhere": ([0, 0, 0, 0], [0, 0, 1, 1])})
    assert m.distinct() == 2 and m.cluster[0] == m.cluster[1] == m.cluster[3] != m.cluster[2]
    assert m.recurs["elsewhere"].tolist() == [True, True, False, True]


# 2. figures of a run, from hand-made items -------------------------------------------------------


def item(tag: str, position: int, text: str) -> Item:
    from reflact.prompting.plan import parse_tag

    return Item(tag, position, *parse_tag(tag), item_key({"op": "append", "content": text}))


def hand_made_run(seed: int = 1, cost: float = 0.5, **settings) -> Run:
    """Two failure minibatches, two draws each, and one success minibatch with one draw."""
    items = [item("minibatch_fail_000", 0, "- Check the order status."),
             item("minibatch_fail_000", 1, "- Refund in cents."),
             item("minibatch_fail_000.d1", 0, "- check the order status"),  # agrees with draw 0
             item("minibatch_fail_000.d1", 1, "- Escalate disputes to a human."),
             item("minibatch_fail_001", 0, "- Refund in cents."),  # redundant with fail_000
             item("minibatch_fail_001.d1", 0, "- Greet the customer."),
             item("minibatch_succ_000", 0, "- Check the order status.")]  # the other group: not redundant
    draws = {("failure", 0): 2, ("failure", 1): 2, ("success", 0): 1}
    from collections import Counter

    return Run(Path(f"run{seed}"), {"update_mode": "patch", "minibatch_size": 4, "edit_budget": 2, "seed": seed,
                                    "samples": 2, **settings}, cost, Counter(draws), items)


def test_run_figures_agreement_redundancy_distinct_and_per_dollar():
    figures = analyse(hand_made_run(), DEFAULT)
    assert figures["edits"] == 7
    # fail_000: 4 items, 2 agree across draws; fail_001: 2 items, none; succ_000 has one draw
    assert [(m["minibatch"], m["edits"], m["agreeing"]) for m in figures["minibatches"]] == [
        ("minibatch_fail_000", 4, 2), ("minibatch_fail_001", 2, 0)]
    assert figures["agreement"] == pytest.approx(2 / 6) and figures["agreeing_edits"] == 2
    # "Refund in cents." in fail_000 and fail_001; "Check the order status." only in one failure minibatch
    assert figures["redundant_edits"] == 2 and figures["redundancy"] == pytest.approx(2 / 7)
    # status (x3), cents (x2), disputes, greet
    assert figures["distinct_edits"] == 4 and figures["distinct_edits_per_usd"] == pytest.approx(8.0)
    assert sorted(map(len, figures["near_duplicates"])) == [2, 3]


def test_agreement_is_undefined_with_one_draw_and_per_dollar_without_a_price():
    run = hand_made_run(cost=0.0)
    run.draws = {key: 1 for key in run.draws}
    figures = analyse(run, DEFAULT)
    assert figures["agreement"] is None and "minibatches" not in figures
    assert figures["distinct_edits_per_usd"] is None


def test_seed_agreement_compares_runs_that_differ_only_in_the_seed():
    one, two = hand_made_run(seed=1), hand_made_run(seed=2)
    two.items = two.items[:2] + [item("minibatch_fail_001", 0, "- Something else entirely, quite long.")]
    other_m = hand_made_run(seed=3, minibatch_size=8)
    cells = seed_agreement([one, two, other_m], DEFAULT)
    by_m = {c["M"]: c for c in cells}
    # run 1's "status" x3 and "cents" x2 recur in run 2 (status, cents); run 2's first two recur in run 1
    assert by_m[4]["seeds"] == 2 and by_m[4]["edits"] == 10 and by_m[4]["recurring"] == 7
    assert by_m[4]["seed_agreement"] == pytest.approx(0.7)
    assert by_m[8]["seeds"] == 1 and by_m[8]["seed_agreement"] is None


@pytest.mark.slow
def test_ten_thousand_templated_items_that_all_match_cost_no_memory_for_pairs():
    """50 million matching pairs are used chunk by chunk, never held (a run whose items all look alike)."""
    keys = [item_key({"op": "append", "content": f"- rule {i % 3} from run_{i:05d}"}) for i in range(10_000)]
    m = match(keys, 0.8, {"any": ([0] * 10_000, list(range(10_000)))})
    assert m.distinct() == 1 and m.recurs["any"].all()


# 3. repeated draws through the stage --------------------------------------------------------------


def stage_for(tmp_path, server, data, *overrides, run_dir=None, optimizer=None):
    """The shared stage_for, with minibatches of 4 unless a test says otherwise."""
    return shared_stage_for(tmp_path, server, data, "reflect.minibatch_size=4", *overrides, run_dir=run_dir,
                            optimizer=optimizer)


def saved(run_dir: Path, tag: str) -> dict:
    return json.loads((run_dir / "patches" / f"{tag}.json").read_text())


def test_k_draws_make_k_conversations_each_with_its_files_fingerprint_and_seed(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=8, n_succ=0)
    outcomes = stage_for(tmp_path, server, data, "optimizer.samples=3", "optimizer.temperature=1",
                         "optimizer.sample=5").run()
    assert [o.tag for o in outcomes] == ["minibatch_fail_000", "minibatch_fail_000.d1", "minibatch_fail_000.d2",
                                         "minibatch_fail_001", "minibatch_fail_001.d1", "minibatch_fail_001.d2"]
    assert server.count == 6 and sorted(r["seed"] for r in server.requests) == [5, 5, 6, 6, 7, 7]
    run = tmp_path / "run"
    for o in outcomes:
        assert (run / "calls" / o.tag / "user.md").is_file() and (run / "calls" / o.tag / "reply_1.txt").is_file()
    patches = [saved(run, o.tag) for o in outcomes]
    assert len({p["fingerprint"] for p in patches}) == 6
    # the draws of one minibatch saw the same prompt and answered partly differently (the server varies
    # its items by seed, and rewords them for odd seeds: seeds 5 and 7 share some items word for word)
    first = [p["patch"]["edits"] for p in patches[:3]]
    assert {json.dumps(e) for e in first[0]} & {json.dumps(e) for e in first[2]}
    assert first[0] != first[1] != first[2] != first[0]
    assert len({(run / "calls" / o.tag / "user.md").read_text() for o in outcomes[:3]}) == 1


def test_one_draw_sends_no_seed_and_keeps_its_names_and_fingerprint(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=4, n_succ=0)
    stage = stage_for(tmp_path, server, data, "optimizer.temperature=1")
    [o] = stage.run()
    assert o.tag == "minibatch_fail_000" and "seed" not in server.requests[0]
    patch = saved(tmp_path / "run", o.tag)
    messages = server.requests[0]["messages"]
    # the fingerprint of a single draw is what it always was (a rerun after the upgrade reuses it)
    shape = {"model": "test", "mode": "patch", "budget": 4, "temperature": 1.0, "reasoning_effort": None,
             "sample": 0, "messages": messages}
    assert patch["fingerprint"] == hashlib.sha256(json.dumps(shape, sort_keys=True, ensure_ascii=False)
                                                  .encode("utf-8")).hexdigest()
    assert fingerprint(stage.shape, messages, 0) == patch["fingerprint"]


def test_each_draw_is_cached_under_its_own_key(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=8, n_succ=0)
    cache = [f"optimizer.cache_path={tmp_path / 'cache.db'}", "optimizer.cache=read_write"]
    first = stage_for(tmp_path, server, data, "optimizer.samples=2", "optimizer.temperature=1", *cache).run()
    again = stage_for(tmp_path, server, data, "optimizer.samples=2", "optimizer.temperature=1", *cache,
                      run_dir=tmp_path / "fresh").run()
    assert server.count == 4 and [o.cache_hits for o in again] == [1, 1, 1, 1]
    for o in first:  # each draw's own reply came back from the cache
        assert saved(tmp_path / "fresh", o.tag)["patch"] == saved(tmp_path / "run", o.tag)["patch"]


def test_draws_resume_one_by_one_and_more_draws_add_only_the_new_ones(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=8, n_succ=0)
    args = ("optimizer.temperature=1",)
    stage_for(tmp_path, server, data, "optimizer.samples=2", *args).run()
    assert server.count == 4
    again = stage_for(tmp_path, server, data, "optimizer.samples=2", *args).run()
    assert server.count == 4 and {o.status for o in again} == {"reused"}
    (tmp_path / "run" / "patches" / "minibatch_fail_001.d1.json").unlink()
    redo = stage_for(tmp_path, server, data, "optimizer.samples=2", *args).run()
    assert server.count == 5 and [o.status for o in redo] == ["reused", "reused", "reused", "done"]
    more = stage_for(tmp_path, server, data, "optimizer.samples=3", *args).run()
    assert server.count == 7
    assert [o.status for o in more] == ["reused", "reused", "done", "reused", "reused", "done"]


PRICED = ["optimizer.model=gpt-5", "optimizer.prices.gpt-5={input:0,cached_input:0,output:10000}",
          "optimizer.max_output_tokens=100"]  # a call's worst case $1.00; what a reply costs $0.50


def test_the_cost_cap_counts_every_draw(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=8, n_succ=0)
    outcomes = stage_for(tmp_path, server, data, *PRICED, "optimizer.samples=3", "optimizer.temperature=1",
                         "optimizer.max_cost_usd=2.2", "reflect.workers=1").run()
    assert server.count == 3 and sum(o.spent_usd for o in outcomes) == pytest.approx(1.5)
    assert [o.status for o in outcomes] == ["done"] * 3 + ["not_run"] * 3


def test_the_dry_run_counts_every_draw(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=8, n_succ=4)
    one = stage_for(tmp_path, server, data, *PRICED[:2], optimizer=DryRunEstimator(1500),
                    run_dir=tmp_path / "one").run()
    three = stage_for(tmp_path, server, data, *PRICED[:2], "optimizer.samples=3", optimizer=DryRunEstimator(1500),
                      run_dir=tmp_path / "three").run()
    assert server.count == 0 and len(three) == 3 * len(one) and {o.status for o in three} == {"dry_run"}
    assert sum(o.usage.prompt for o in three) == 3 * sum(o.usage.prompt for o in one)
    assert sum(o.cost_usd for o in three) == pytest.approx(3 * sum(o.cost_usd for o in one))


def test_several_draws_without_temperature_are_warned_about(tmp_path, server, caplog):
    data = write_dataset(tmp_path / "d", n_fail=4, n_succ=0)
    with caplog.at_level(logging.WARNING, logger="reflact"):
        stage_for(tmp_path, server, data, "optimizer.samples=2").run()
        stage_for(tmp_path, server, data, "optimizer.samples=2", "optimizer.temperature=0.7",
                  run_dir=tmp_path / "warm").run()
    warned = [r.getMessage() for r in caplog.records if "optimizer.samples" in r.getMessage()]
    assert len(warned) == 1 and "optimizer.temperature unset" in warned[0]


def test_the_test_server_varies_its_items_by_seed_only():
    ids = ["a", "b", "c"]
    assert seeded_items(ids, 6, 0) == seeded_items(ids, 6, 0)
    draws = [seeded_items(ids, 6, seed) for seed in range(3)]
    assert all(draws[0][i] != draws[1][i] for i in range(6) if (i + 1) % 3 == 2)
    request = {"messages": [{"role": "system", "content": "s"},
                            {"role": "user", "content": "## Edit Budget\nProduce at most L=2 edits.\n\n"
                                                        "## Failed Trajectories (1 total)\n\n"
                                                        "### Trajectory 1 of 1 (id: a)\n"}]}
    assert default_reply(request)["patch"]["edits"] == [{"op": "append", "content": f"- rule {i} from a"}
                                                        for i in range(4)]


# 4. provenance ------------------------------------------------------------------------------------


def test_provenance_maps_positions_to_ids_and_counts_what_no_item_stands_on(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=8, n_succ=4)
    cfg = make_config(f"data.dir={data}", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
                      "optimizer.cache=off", "mlflow.enabled=false", "reflect.minibatch_size=4",
                      "reflect.edit_budget=2", "reflect.provenance=true")
    result = run_experiment(config_parts(cfg), {}, tmp_path / "run", Launch(tmp_path))
    assert "## Evidence Behind Each Item" in server.requests[0]["messages"][0]["content"]
    named = set()
    for record in result.summary["minibatches"]:
        patch = saved(tmp_path / "run", record["tag"])
        for edit in patch["patch"]["edits"]:
            assert edit["supporting_ids"] == [patch["trajectory_ids"][p - 1] for p in edit[SUPPORT_FIELD]]
            named.update(edit["supporting_ids"])
    counts = result.summary["counts"]
    # the server's first item names no trajectory, the second one or two: 3 patches x 2 kept items
    assert counts["edits_kept"] == 6 and counts["edits_supported"] == 3 and counts["support_share"] == 0.5
    shown = {i for record in result.summary["minibatches"] for i in record["ids"]}
    assert result.summary["unused_trajectories"] == sorted(shown - named)
    assert counts["trajectories_unused"] == len(shown - named) > 0
    assert result.summary["settings"]["provenance"] is True
    assert "Trajectories no kept item stands on" in (tmp_path / "run" / "report.md").read_text()


def test_a_position_out_of_range_is_asked_again_with_the_reason(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=3, n_succ=0)

    def script(request, number):
        if number == 1:
            reply = default_reply(request)
            reply["patch"]["edits"][0][SUPPORT_FIELD] = [4]
            return Response(body=chat_body(json.dumps(reply)))
        return None

    server.script = script
    [o] = stage_for(tmp_path, server, data, "reflect.provenance=true").run()
    assert o.status == "done" and o.reasks == 1
    reask = server.requests[1]["messages"][-1]["content"]
    assert "supporting_trajectories: 4 is out of range" in reask and "1 to 3" in reask


@pytest.mark.parametrize("given,expected", [([2, "3"], ["t2", "t3"]), ([" t1 ", 1], ["t1"]), (2, ["t2"]),
                                            (None, []), ([], [])])
def test_support_accepts_numbers_digit_strings_and_shown_ids(given, expected):
    reply = {"patch": {"reasoning": "", "edits": [{"op": "append", "content": "x", SUPPORT_FIELD: given}]}}
    checked = with_support_ids(check_reply(reply, PATCH, "failure", 4, False), PATCH, ["t1", "t2", "t3"])
    assert checked.obj["patch"]["edits"][0]["supporting_ids"] == expected


@pytest.mark.parametrize("given", [[0], [True], ["first"], {"a": 1}, [2.5]])
def test_support_refuses_what_is_no_position(given):
    from reflact.replies.patches import ReplyError

    reply = {"patch": {"reasoning": "", "edits": [{"op": "append", "content": "x", SUPPORT_FIELD: given}]}}
    with pytest.raises(ReplyError, match=r"patch\.edits\[0\]\.supporting_trajectories"):
        with_support_ids(check_reply(reply, PATCH, "failure", 4, False), PATCH, ["t1", "t2", "t3"])


@pytest.mark.parametrize("mode", sorted(MODES))
def test_prompts_and_schema_are_unchanged_when_provenance_is_off(mode):
    off = make_config("data.dir=x", "reflect.skill_aware.enabled=true").reflect
    on = make_config("data.dir=x", "reflect.skill_aware.enabled=true", "reflect.provenance=true").reflect
    plain, with_support = (resolve_system_prompts({}, MODES[mode], r) for r in (off, on))
    assert "supporting_trajectories" not in plain.failure + plain.success
    addition = load_template("provenance").strip()
    assert with_support.failure == f"{plain.failure.rstrip()}\n\n{addition}\n"
    assert with_support.success == f"{plain.success.rstrip()}\n\n{addition}\n"
    if mode == "patch":  # without skill-aware additions the plain text is the shipped template itself
        bare = resolve_system_prompts({}, MODES[mode], make_config("data.dir=x").reflect)
        assert bare.failure == load_template(FAILURE.template)
    for group in GROUPS:
        assert reply_schema(MODES[mode], group, True) == reply_schema(MODES[mode], group, True, provenance=False)
        item = reply_schema(MODES[mode], group, True, provenance=True)["properties"]["patch"]["properties"][
            MODES[mode].payload_key]["items"]
        assert SUPPORT_FIELD in item["required"] and "supporting_trajectories" not in json.dumps(
            reply_schema(MODES[mode], group, True))


# 5. the run's analysis.json, MLflow, the sweep report ----------------------------------------------


def experiment(tmp_path, server, data, run_dir, *overrides):
    cfg = make_config(f"data.dir={data}", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
                      "optimizer.cache=off", "mlflow.enabled=false", "reflect.minibatch_size=4",
                      "optimizer.temperature=1", *overrides)
    return run_experiment(config_parts(cfg), {}, run_dir, Launch(tmp_path))


def test_a_run_writes_its_analysis_and_a_single_draw_has_no_agreement(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=16, n_succ=8)
    one = experiment(tmp_path, server, data, tmp_path / "one")
    three = experiment(tmp_path, server, data, tmp_path / "three", "optimizer.samples=3",
                       "+optimizer.prices.test={input:1,cached_input:0.1,output:4}")
    saved_one = json.loads((tmp_path / "one" / "analysis.json").read_text())
    assert saved_one["edits"] == one.summary["counts"]["edits_kept"] and saved_one["agreement"] is None
    assert saved_one["threshold"] == DEFAULT and saved_one["distinct_edits_per_usd"] is None  # unpriced
    figures = three.analysis
    assert figures == json.loads((tmp_path / "three" / "analysis.json").read_text())
    assert figures["edits"] == three.summary["counts"]["edits_kept"] == 3 * saved_one["edits"]
    # the server gives each draw items of its own beside those every draw repeats
    assert 0 < figures["agreement"] < 1 and len(figures["minibatches"]) == 6
    assert figures["distinct_edits_per_usd"] == pytest.approx(
        figures["distinct_edits"] / three.summary["counts"]["cost_usd"], rel=1e-4)
    assert figures == analyse(load_run(tmp_path / "three"), DEFAULT)  # the same as after the fact


def test_the_sweep_report_shows_the_analysis_next_to_m_and_l(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=16, n_succ=8)
    rows = []
    for seed in (1, 2):
        done = experiment(tmp_path, server, data, tmp_path / f"s{seed}", f"reflect.seed={seed}",
                          "optimizer.samples=2")
        rows.append({"M": 4, "L": 4, "mode": 0, "edits_kept": done.summary["counts"]["edits_kept"],
                     "run_dir": str(tmp_path / f"s{seed}"), **{k: done.analysis[k] for k in (
                         "agreement", "redundancy", "distinct_edits")}})
    rows.append({"M": 8, "L": 4, "mode": 0, "edits_kept": 3, "redundancy": 0.5})  # k = 1: no agreement
    runs = pd.DataFrame(rows)
    grid = grid_rows(runs)
    metrics = add_seed_agreement(grid, runs)
    cells = {(r["M"], r["L"]): r for r in grid}
    expected = seed_agreement([load_run(tmp_path / "s1"), load_run(tmp_path / "s2")], DEFAULT)[0]["seed_agreement"]
    assert cells[(4, 4)]["seed_agreement"] == pytest.approx(expected) and 0 < expected < 1
    assert metrics == {"seed_agreement/patch_M4_L4": pytest.approx(expected),
                       "seed_agreement_mean": pytest.approx(expected)}
    assert cells[(4, 4)]["agreement_mean"] == pytest.approx((rows[0]["agreement"] + rows[1]["agreement"]) / 2)
    _, md = write_table(grid, tmp_path / "report")
    header, _, first, second = md.read_text().splitlines()[2:6]
    assert header.startswith("| mode | M | L | jobs finished/failed/missing | matcher | seed_agreement | agreement "
                             "| redundancy |")
    assert first.split(" | ")[4] == "lexical"  # the matcher the jobs' analyses used
    assert second.split(" | ")[5:7] == ["–", "–"]  # M=8: one seed, one draw


@pytest.mark.slow
def test_a_run_logs_its_analysis_to_mlflow(tmp_path, server, launch_dir):
    from mlflow.tracking import MlflowClient

    data = write_dataset(tmp_path / "d", n_fail=16, n_succ=0)
    cfg = make_config(f"data.dir={data}", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
                      "optimizer.cache=off", "reflect.minibatch_size=4", "optimizer.temperature=1",
                      "optimizer.samples=2", "mlflow.trace_calls=false")
    result = run_experiment(config_parts(cfg), {}, tmp_path / "run", Launch(launch_dir))
    client = MlflowClient(f"sqlite:///{launch_dir / 'outputs' / 'mlflow.db'}")
    run = client.get_run(result.mlflow_run_id)
    for key in ("agreement", "redundancy", "distinct_edits"):
        assert run.data.metrics[key] == pytest.approx(result.analysis[key])
    assert run.data.metrics["samples"] == 2 and run.info.run_name.endswith("k2")
    history = client.get_metric_history(result.mlflow_run_id, "minibatch/agreement")
    assert sorted(m.step for m in history) == [0, 2, 4, 6]  # each minibatch at its first draw
    assert "run/analysis.json" in {a.path for a in client.list_artifacts(result.mlflow_run_id, "run")}


# 6. python -m reflact.analyze ------------------------------------------------------------------


def analyze_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    return subprocess.run([sys.executable, "-m", "reflact.analyze", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=180)



def test_analyze_reads_a_run_of_the_shipped_demo(tmp_path, server):
    """The demo's saved config names its data as ${shipped:demo}: analyze resolves it as the run did."""
    run_dir = tmp_path / "demo"
    done = run_cli("+exp=demo", "optimizer=compatible", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
                   "mlflow.enabled=false", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "${shipped:demo}" in (run_dir / ".hydra" / "config.yaml").read_text(encoding="utf-8")
    proc = analyze_cli(str(run_dir), "--out", str(tmp_path / "report"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "report" / "analysis.json").is_file()

@pytest.fixture
def two_seeds(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=16, n_succ=8)
    for seed in (1, 2):
        experiment(tmp_path, server, data, tmp_path / "runs" / f"seed{seed}", f"reflect.seed={seed}",
                   "optimizer.samples=2")
    return tmp_path / "runs"


def test_analyze_reports_the_runs_figures_and_their_seed_agreement(tmp_path, two_seeds):
    done = analyze_cli(str(two_seeds / "seed1"), str(two_seeds / "seed2"), "--out", "rep", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "rep"
    assert (out / "analysis.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    result = json.loads((out / "analysis.json").read_text())
    for row in result["runs"]:  # the same figures as the run wrote at its end
        own = json.loads((Path(row["run_dir"]) / "analysis.json").read_text())
        assert {k: row[k] for k in ("edits", "distinct_edits", "redundancy", "agreement")} == {
            k: own[k] for k in ("edits", "distinct_edits", "redundancy", "agreement")}
    [cell] = result["cells"]
    assert cell["seeds"] == 2 and 0 < cell["seed_agreement"] < 1
    md = (out / "analysis.md").read_text()
    assert md.count("| patch | 4 | 4 |") == 3  # two runs and their cell
    strict = analyze_cli(str(two_seeds / "seed1"), "--threshold", "1", "--out", "strict", cwd=tmp_path)
    assert strict.returncode == 0, strict.stderr
    strict_result = json.loads((tmp_path / "strict" / "analysis.json").read_text())
    [row] = strict_result["runs"]
    assert row["threshold"] == 1.0 and row["agreement"] < result["runs"][0]["agreement"]  # rewordings no longer match

    # how far to trust the matcher in use: measured on the shipped labelled pairs (bench/README.md's
    # figures for the lexical matcher at 0.85: 10 of 85 paraphrases matched, 35 of 113 different changes
    # merged; on the held-out file alone 6 of 21 and 6 of 30)
    data = PROJECT / "bench" / "data"
    held_out = [json.loads(line) for line in (data / "match_pairs_heldout.jsonl").read_text().splitlines()]
    pairs = [json.loads(line) for line in (data / "match_pairs.jsonl").read_text().splitlines()] + held_out
    trust = result["matcher_trust"]
    assert (trust["paraphrases"], trust["different_changes"]) == (sum(p["same"] for p in pairs),
                                                                  sum(not p["same"] for p in pairs))
    assert (trust["paraphrases_matched"], trust["different_merged"]) == (10, 35)
    assert (trust["held_out_paraphrases"], trust["held_out_different_changes"]) == (
        sum(p["same"] for p in held_out), sum(not p["same"] for p in held_out))
    assert (trust["held_out_paraphrases_matched"], trust["held_out_different_merged"]) == (6, 6)
    assert trust["paraphrase_recall"] == round(10 / trust["paraphrases"], 4)
    assert result["metrics"]["matcher_different_merged_rate"] == trust["different_merged_rate"]
    assert result["metrics"]["matcher_held_out_paraphrase_recall"] == trust["held_out_paraphrase_recall"]
    assert f"matches 10 of {trust['paraphrases']} paraphrases" in md and "merges 35 of" in md
    assert f"held out from its tuning, it matches 6 of {trust['held_out_paraphrases']} paraphrases" in md
    # the matcher in use: at threshold 1 only the same words match (one paraphrase pair reorders them, and
    # one different change swaps two phrases: the same words, sorted)
    assert (strict_result["matcher_trust"]["paraphrases_matched"], strict_result["matcher_trust"]["different_merged"]) \
        == (1, 1)


@pytest.mark.parametrize("args,names", [
    (["nowhere"], "nowhere: no such directory"),
    (["empty"], "empty: neither a finished run dir nor a sweep dir"),
    (["runs/seed1", "--threshold", "0"], "--threshold must be > 0"),
    (["runs/seed1", "--log"], "--log: none of the given dirs belongs to a sweep"),
])
def test_analyze_mistakes_are_one_line_errors(tmp_path, two_seeds, args, names):
    (tmp_path / "empty").mkdir()
    done = analyze_cli(*args, cwd=tmp_path)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("reflact: error: ") and names in lines[0]


def test_a_sweep_dir_stands_for_its_job_run_dirs_however_deep(tmp_path, two_seeds):
    """Hydra names job folders after their overrides: a value with a slash nests them deeper."""
    from reflact.analyze import resolve
    from reflact.running.rundir import SweepDir

    nested = two_seeds / "data.dir=" / "data" / "x,reflect.seed=1"
    nested.parent.mkdir(parents=True)
    (two_seeds / "seed1").rename(nested)
    SweepDir(two_seeds).write_identity({"fixed": {}, "swept": {}})
    runs, sweeps = resolve([two_seeds])
    assert runs == [nested.resolve(), (two_seeds / "seed2").resolve()]
    assert [s.root for s in sweeps] == [two_seeds.resolve()]
    assert [s.root for s in resolve([nested])[1]] == [two_seeds.resolve()]  # a job's run dir finds its sweep
    assert SweepDir.holding(tmp_path / "d") is None


def test_analyze_refuses_runs_analysed_with_different_thresholds_unless_told(tmp_path, two_seeds):
    path = two_seeds / "seed2" / "analysis.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "threshold": 0.9}))
    with pytest.raises(UserError, match="different match thresholds.*--threshold"):
        from reflact.analyze import analyze

        analyze([two_seeds / "seed1", two_seeds / "seed2"], tmp_path / "out", None, False)


@pytest.mark.slow
def test_analyze_logs_to_the_sweeps_mlflow_parent(tmp_path, two_seeds, migrated_store):
    from mlflow.tracking import MlflowClient

    from reflact.running.rundir import SweepDir

    store = tmp_path / "mlflow.db"
    shutil.copy(migrated_store, store)
    uri = f"sqlite:///{store}"
    client = MlflowClient(uri)
    experiment_id = client.create_experiment("x", artifact_location=(tmp_path / "artifacts").as_uri())
    parent = client.create_run(experiment_id, run_name="sweep x").info.run_id
    SweepDir(two_seeds).write_parent_record({"run_id": parent, "tracking_uri": uri, "sweep_id": "runs"})
    done = analyze_cli("runs", "--log", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (two_seeds / "report" / "analysis.md").is_file()  # one sweep dir: its report folder
    metrics = client.get_run(parent).data.metrics
    assert 0 < metrics["seed_agreement/patch_M4_L4"] < 1 and metrics["analysis_threshold"] == DEFAULT
    assert {"redundancy_mean", "agreement_mean", "seed_agreement_mean"} <= set(metrics)
    assert {a.path for a in client.list_artifacts(parent, "analysis")} == {
        "analysis/analysis.md", "analysis/analysis.png", "analysis/analysis.json"}


def _components(n: int, pairs: list[tuple[int, int]]) -> set[frozenset[int]]:
    """The connected components, the slow and obvious way."""
    groups = [{i} for i in range(n)]
    for a, b in pairs:
        ga = next(g for g in groups if a in g)
        gb = next(g for g in groups if b in g)
        if ga is not gb:
            ga |= gb
            groups.remove(gb)
    return {frozenset(g) for g in groups}


@pytest.mark.parametrize("seed", range(40))
def test_linked_items_fall_into_the_components_of_their_links(seed):
    """Items linked directly or through others are one cluster, chunk after chunk of pairs."""
    import numpy as np

    rng = random.Random(seed)
    n = rng.randint(1, 60)
    chunks = [[(rng.randrange(n), rng.randrange(n)) for _ in range(rng.randint(0, n))] for _ in range(3)]
    component = np.arange(n)
    for chunk in chunks:
        a = np.array([p[0] for p in chunk], dtype=np.int64)
        b = np.array([p[1] for p in chunk], dtype=np.int64)
        component = matching._joined(component, a, b)
    found: dict[int, set[int]] = {}
    for item, label in enumerate(component.tolist()):
        found.setdefault(label, set()).add(item)
    assert {frozenset(g) for g in found.values()} == _components(n, [p for c in chunks for p in c])
