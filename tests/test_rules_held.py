"""Rules a one-line change broke unnoticed (issue 41), each held here by a fast test that fails when
its rule is broken (each checked once by breaking the rule by hand): what `failed_calls` counts,
how params render, the analysis's budget and matchers, the dry run's estimate, seed-agreement
cells, relog's traces, repaired replies, the analysis's share of the cost cap, and a sweep
parent's means; then issue 36's start of the end's wait, and what mutation testing (bench/mutants.py)
left standing among the documented rules. Most run in-process against the loopback stand-in server
in well under a second (the two through MLflow take a few)."""

from __future__ import annotations

import json
import logging
import math
import shutil
import sqlite3
from pathlib import Path

import pytest

from reflact.config import PARAM_MAX_CHARS, params
from reflact.config import parts as config_parts
from reflact.orchestration.experiment import Launch, run_experiment
from reflact.running.summary import counts
from reflact.testing.optimizer_server import Response, chat_body, default_reply, embedding_body
from tests.conftest import make_config, stage_for, write_dataset

OFFLINE = ("data.dir=unused", "optimizer.base_url=http://127.0.0.1:9", "optimizer.model=test")
QUICK = ("optimizer.model=test", "optimizer.retry.initial_wait_s=0.01", "optimizer.retry.max_wait_s=0.02",
         "mlflow.enabled=false", "reflect.workers=1", "reflect.minibatch_size=1")


def settings(server, data: Path, *extra: str) -> list[str]:
    return [f"data.dir={data}", f"optimizer.base_url={server.base_url}", "optimizer.cache=off", *QUICK, *extra]


def run(tmp_path: Path, name: str, *overrides: str):
    return run_experiment(config_parts(make_config(*overrides)), {}, tmp_path / name, Launch(tmp_path))


def shown_id(request: dict) -> str:
    """The first trajectory id a chat request shows ('' for an embeddings request)."""
    if "messages" not in request:
        return ""
    user = request["messages"][1]["content"]
    return user.split("(id: ", 1)[1].split(")", 1)[0] if "(id: " in user else ""


def one_edit(request: dict, content: str, completion_tokens: int = 50) -> Response:
    """A valid reply whose patch is the one append edit `content` (its characters as they are in the
    reply's text: the body's JSON escapes what needs it)."""
    reply = default_reply(request)
    reply["patch"] = {"reasoning": "r", "edits": [{"op": "append", "content": content}]}
    return Response(body=chat_body(json.dumps(reply, ensure_ascii=False), completion_tokens=completion_tokens))


# ---------------------------------------------------------------- 1. failed_calls counts requests


def test_failed_calls_counts_failed_requests_not_minibatches_without_a_usable_reply(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=3, n_succ=0)

    def script(request, number):
        if shown_id(request) == "run_00000":  # an API error after the retries: one failed request
            return Response(status=500, body={"error": {"message": "down"}})
        if shown_id(request) == "run_00001":  # never usable, re-asked once: two requests, none failed
            return Response(body=chat_body("No object here."))
        return None

    server.script = script
    done = run(tmp_path, "run", *settings(server, data, "optimizer.retry.max_attempts=2", "reflect.max_reasks=1"))
    c = done.summary["counts"]
    assert (c["minibatches_failed"], c["minibatches_done"], c["failed_calls"]) == (2, 1, 1)
    assert c["reasks"] == 1 and server.count == 2 + 2 + 1

    # a run stopped before its requests: every minibatch failed, no request failed
    stage = stage_for(tmp_path, server, data, "reflect.minibatch_size=1", "reflect.workers=1", run_dir=tmp_path / "s")
    stage.asker.stopping.set()
    outcomes = stage.run()
    stopped = counts(stage.settings.reflect, True, stage.dataset, outcomes, 0.0)
    assert all(o.error.startswith("stopped") for o in outcomes)
    assert (stopped["minibatches_failed"], stopped["failed_calls"]) == (3, 0)


# ---------------------------------------------------------------- 2. and 3. how params render


def test_params_show_an_enum_setting_as_its_value():
    p = params(make_config(*OFFLINE, "optimizer.cache=read", "optimizer.service_tier=flex",
                           "analysis.matcher=embedding", "data.on_bad_conversation=skip"))
    assert (p["optimizer.cache"], p["optimizer.service_tier"], p["analysis.matcher"]) == ("read", "flex", "embedding")
    assert (p["optimizer.provider"], p["optimizer.structured_output"], p["reflect.update_mode"]) == (
        "openai", "auto", "patch")
    assert p["data.on_bad_conversation"] == "skip"


def test_a_param_longer_than_500_characters_is_cut_to_500_with_an_ellipsis_and_one_of_500_is_whole():
    assert PARAM_MAX_CHARS == 500  # the documented limit (behaviour.md 10.1)
    whole, cut = "w" * 499 + "z", "c" * 500 + "z"
    p = params(make_config(*OFFLINE, f"reflect.meta_skill={whole}", f"reflect.step_buffer={cut}"))
    assert p["reflect.meta_skill"] == whole
    assert p["reflect.step_buffer"] == "c" * 499 + "…" and len(p["reflect.step_buffer"]) == 500


def test_a_sweep_parents_swept_values_are_cut_to_500_characters_like_every_param():
    from reflact.sweeps.sweep import listed

    seeds = [str(n) for n in range(300)]  # "0,1,...,299": 1,189 characters
    shown = listed({"reflect.seed": seeds, "reflect.edit_budget": ["1", "2"]})
    assert shown["reflect.seed"] == ",".join(seeds)[:499] + "…"
    assert shown["reflect.edit_budget"] == "1,2"
    exact = ["x" * 249, "y" * 250]  # joined: exactly 500
    assert listed({"k": exact})["k"] == ",".join(exact)


# ---------------------------------------------------------------- 4. analysis.max_items


def test_a_run_with_more_kept_items_than_analysis_max_items_skips_its_analysis_and_one_with_as_many_does_not(
        tmp_path, server, caplog):
    data = write_dataset(tmp_path / "d", n_fail=1, n_succ=0)  # one minibatch: L=4 items kept
    base = settings(server, data, "reflect.edit_budget=4")
    analysed = run(tmp_path, "at", *base, "analysis.max_items=4").analysis
    assert "skipped" not in analysed and analysed["edits"] == 4 and analysed["redundancy"] == 0.0
    caplog.set_level(logging.INFO, logger="reflact")
    over = run(tmp_path, "over", *base, "analysis.max_items=3").analysis
    why = "4 kept items, over analysis.max_items=3"
    assert over["skipped"].startswith(why) and "python -m reflact.analyze" in over["skipped"]
    assert "redundancy" not in over
    assert json.loads((tmp_path / "over" / "analysis.json").read_text())["skipped"] == over["skipped"]
    assert f"analysis: {why}" in caplog.text


# ---------------------------------------------------------------- 5. the dry run's estimate


@pytest.mark.parametrize("mode,counts_skill", [("patch", False), ("rewrite", False), ("full_rewrite", True)])
def test_the_dry_runs_reply_estimate_counts_the_skill_only_for_a_full_rewrite(tmp_path, mode, counts_skill):
    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=1)
    skill = (data / "skill.md").read_text() + "- a long rule\n" * 300  # 4,000+ characters
    (data / "skill.md").write_text(skill)
    done = run(tmp_path, "dry", f"data.dir={data}", "optimizer=dry_run", *QUICK, f"reflect.update_mode={mode}",
               "reflect.minibatch_size=2", "+optimizer.prices.test={input:1,output:2}")
    c = done.summary["counts"]
    per_reply = 1500 + (len(skill) // 4 if counts_skill else 0)
    assert c["minibatches_dry_run"] == 2 and c["tokens_completion"] == 2 * per_reply
    assert c["cost_usd"] == pytest.approx((c["tokens_prompt"] + 2 * c["tokens_completion"]) / 1e6, abs=1e-6)


# ---------------------------------------------------------------- 6. seed-agreement cells


def test_runs_that_differ_only_in_seed_and_workers_share_one_seed_agreement_cell(tmp_path, server):
    from reflact.analysis.figures import load_runs_quietly, seed_agreement

    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=0)
    base = settings(server, data, "reflect.minibatch_size=2")
    run(tmp_path, "a", *base, "reflect.seed=1", "reflect.workers=1")
    run(tmp_path, "b", *base, "reflect.seed=2", "reflect.workers=3")
    run(tmp_path, "c", *base, "reflect.seed=3", "reflect.edit_budget=2")  # another L: another cell
    rows = seed_agreement(load_runs_quietly([tmp_path / "a", tmp_path / "b", tmp_path / "c"]), 0.85)
    assert sorted((r["L"], r["seeds"], r["runs"]) for r in rows) == [(2, 1, 1), (4, 2, 2)]
    [pair] = [r for r in rows if r["L"] == 4]
    assert pair["seed_agreement"] is not None and pair["edits"] == 8


# ---------------------------------------------------------------- 7. relog's traces


def test_relog_writes_one_trace_per_recorded_request_with_its_messages_and_usage(tmp_path, server, migrated_store):
    from mlflow.tracking import MlflowClient

    import reflact
    from reflact.relog import relog
    from reflact.running.rundir import TRACES

    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=1)
    live, again = tmp_path / "live.db", tmp_path / "again.db"
    shutil.copy(migrated_store, live)
    shutil.copy(migrated_store, again)
    failing = iter([Response(body=chat_body("not yet an object"))])  # one re-ask: 4 requests, 3 minibatches
    server.script = lambda request, number: next(failing, None)
    overrides = [o for o in settings(server, data) if not o.startswith(("data.dir", "mlflow."))]
    done = reflact.reflect(data, overrides=[*overrides, f"mlflow.tracking_uri=sqlite:///{live}"],
                           run_dir=tmp_path / "run", launch_dir=tmp_path)
    assert done.status == "FINISHED" and done.summary["counts"]["calls"] == 4
    recorded = [json.loads(line) for line in (tmp_path / "run" / TRACES).read_text().splitlines()]
    assert len(recorded) == 4

    run_id = relog(tmp_path / "run", tmp_path, f"sqlite:///{again}")
    client = MlflowClient(tracking_uri=f"sqlite:///{again}")
    experiment = client.get_experiment_by_name("reflact")
    traces = client.search_traces(locations=[experiment.experiment_id], run_id=run_id, max_results=100)
    by_request = {(t.info.tags["reflact.minibatch"], int(t.info.tags["reflact.request"])): t for t in traces}
    assert set(by_request) == {(r["tag"], r["number"]) for r in recorded} and len(traces) == 4
    for record in recorded:
        span = by_request[(record["tag"], record["number"])].data.spans[0]
        assert span.inputs["messages"] == record["messages"]
        assert span.attributes["tokens_prompt"] == record["reply"]["usage"]["prompt"] == 100
        assert span.attributes["tokens_completion"] == 50


# ---------------------------------------------------------------- 8. lone surrogates in a reply


def test_a_lone_surrogate_in_a_reply_becomes_u_fffd_in_the_patch_and_the_cache(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=1, n_succ=0)
    # the body's JSON holds "\ud800" inside the content string (the server's json.dumps escapes the
    # lone half): the reply's text, as JSON decodes it, holds a lone surrogate
    server.script = lambda request, number: one_edit(request, "- Amounts are in cents \ud800.")
    cache = tmp_path / "cache.db"
    cached = ["optimizer.cache=read_write", f"optimizer.cache_path={cache}"]
    first = run(tmp_path, "run", *settings(server, data), *cached)
    [patch_file] = (tmp_path / "run" / "patches").glob("*.json")
    patch = json.loads(patch_file.read_bytes().decode("utf-8"))  # strict UTF-8
    assert patch["patch"]["edits"] == [{"op": "append", "content": "- Amounts are in cents \ufffd."}]
    [(stored,)] = sqlite3.connect(cache).execute("SELECT reply FROM replies").fetchall()
    text = json.loads(stored)["text"]
    assert "\ufffd" in text and not any("\ud800" <= ch <= "\udfff" for ch in text)
    text.encode("utf-8")
    again = run(tmp_path, "again", *settings(server, data), *cached)  # answered by the cache
    assert again.summary["counts"]["cache_hits"] == 1 and again.patches == first.patches


# ---------------------------------------------------------------- 9. to 11. the analysis's matchers and the cap

EMBEDDING = "emb"


def cosine_pair(threshold_gap: float, at: float = 0.9):
    """Two edits whose embeddings are `at + threshold_gap` cosine-similar, as a server script: the
    first failure's reply proposes alpha, the second's beta, each /embeddings request is answered."""
    cos = at + threshold_gap

    def vector(text: str) -> list[float]:
        return [1.0, 0.0] if "alpha" in text else [cos, math.sqrt(1 - cos * cos)]

    def script(request, number):
        if "input" in request:
            return Response(body=embedding_body([vector(t) for t in request["input"]]))
        return one_edit(request, "- alpha rule." if shown_id(request) == "run_00000" else "- beta rule.")

    return script


def embedded(server, data: Path, *extra: str) -> list[str]:
    return settings(server, data, "analysis.matcher=embedding", f"analysis.embedding.base_url={server.base_url}",
                    f"analysis.embedding.model={EMBEDDING}", "analysis.guards=[]", *extra)


@pytest.mark.parametrize("gap,matched", [(0.0, True), (-0.02, False)])
def test_the_embedding_matcher_matches_at_its_threshold_and_not_below(tmp_path, server, gap, matched):
    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=0)
    server.script = cosine_pair(gap, at=0.8)
    figures = run(tmp_path, "run", *embedded(server, data, "analysis.embedding.threshold=0.8")).analysis
    assert figures["matcher"] == "embedding" and figures["edits"] == 2
    assert (figures["redundant_edits"], figures["distinct_edits"]) == ((2, 1) if matched else (0, 2))


def test_a_repeated_embedding_analysis_is_answered_by_the_response_cache(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=0)
    server.script = cosine_pair(0.0)
    cached = [o for o in embedded(server, data) if o != "optimizer.cache=off"]
    cached += ["optimizer.cache=read_write", f"optimizer.cache_path={tmp_path / 'cache.db'}"]
    first = run(tmp_path, "first", *cached).analysis
    again = run(tmp_path, "again", *cached).analysis
    assert first["analysis_calls"]["embedding"]["requests"] == 1
    calls = again["analysis_calls"]["embedding"]
    assert (calls["requests"], calls["cache_hits"]) == (0, 2)
    assert again["redundant_edits"] == first["redundant_edits"] == 2
    assert len([r for r in server.requests if "input" in r]) == 1


def test_analysis_json_names_the_number_of_draws(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=1, n_succ=0)
    done = run(tmp_path, "run", *settings(server, data, "optimizer.samples=2", "optimizer.temperature=1"))
    assert done.analysis["samples"] == 2 and done.analysis["agreement"] is not None


def test_flex_and_batch_replies_cost_half_of_every_listed_amount_unless_the_tier_has_its_own():
    price = make_config(*OFFLINE, "+optimizer.prices.test={input:1,cached_input:0.2,output:4}").optimizer.prices["test"]
    for tier in ("flex", "batch"):
        half = price.at(tier)
        assert (half.input, half.cached_input, half.output) == (0.5, 0.1, 2.0)
    listed = price.at("priority")
    assert (listed.input, listed.cached_input, listed.output) == (1, 0.2, 4)


# USD per million tokens: prompts are free, so a request's worst case is its output allowance alone
PRICED = ("+optimizer.prices.test={input:0,output:1}", "optimizer.max_output_tokens=1000")


def test_the_analysis_gets_only_what_the_stage_left_of_the_cost_cap(tmp_path, server):
    """Two replies of 900 tokens under a cap of 1,900: $0.0001 left, less than the embeddings' worst
    case (their texts' bytes at $10 per million), which the whole cap would hold."""
    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=0)
    script = cosine_pair(0.0)
    server.script = lambda request, number: script(request, number) if "input" in request else one_edit(
        request, "- alpha rule." if shown_id(request) == "run_00000" else "- beta rule.", completion_tokens=900)
    done = run(tmp_path, "run", *embedded(server, data, *PRICED, f"+optimizer.prices.{EMBEDDING}={{input:10}}",
                                          "optimizer.max_cost_usd=0.0019"))
    assert done.summary["counts"]["spent_usd"] == pytest.approx(0.0018)
    assert "cost limit" in done.analysis["skipped"] and "embedding requests" in done.analysis["skipped"]
    assert done.analysis["analysis_calls"]["embedding"]["requests"] == 0
    assert not [r for r in server.requests if "input" in r]
    # with the stage's replies cheaper, the same cap leaves room for them
    server.script = script
    room = run(tmp_path, "room", *embedded(server, data, *PRICED, f"+optimizer.prices.{EMBEDDING}={{input:10}}",
                                           "optimizer.max_cost_usd=0.0019"))
    assert "skipped" not in room.analysis and room.analysis["analysis_calls"]["embedding"]["requests"] == 1


def test_a_judge_question_is_sent_only_when_its_worst_case_fits_what_is_left_of_the_cap(tmp_path, server):
    """Three minibatches spend 3 x 100 tokens; each question may cost 2,000 and costs 50: under a cap of
    2,320 the first fits (300 + 2,000), the second would pass it (350 + 2,000) and is not sent."""
    from reflact.analysis.judge import MARKER

    data = write_dataset(tmp_path / "d", n_fail=3, n_succ=0)
    words = {"run_00000": "- alpha rule.", "run_00001": "- alpha rule!", "run_00002": "- alpha rule?"}

    def script(request, number):
        if "input" in request:
            return Response(body=embedding_body([[1.0, 0.0] for _ in request["input"]]))
        if MARKER in request["messages"][0]["content"]:
            return Response(body=chat_body('{"same": [true]}', completion_tokens=50))
        return one_edit(request, words[shown_id(request)], completion_tokens=100)

    server.script = script
    judge = ("analysis.matcher=judge", "analysis.judge.batch=1", "analysis.judge.max_output_tokens=2000")
    done = run(tmp_path, "run", *embedded(server, data, *PRICED, *judge, f"+optimizer.prices.{EMBEDDING}={{input:0}}",
                                          "optimizer.max_cost_usd=0.00232"))
    judged = [r for r in server.requests if "messages" in r and MARKER in r["messages"][0]["content"]]
    assert len(judged) == 1
    assert "cost limit" in done.analysis["skipped"] and "judge's questions" in done.analysis["skipped"]
    assert done.summary["counts"]["spent_usd"] == pytest.approx(0.0003)
    # the question that was sent is kept in the run dir with its reply and usage (behaviour.md)
    [kept] = (tmp_path / "run" / "calls" / "analysis_judge").glob("judge_*.json")
    question = json.loads(kept.read_text())
    assert question["messages"] == judged[0]["messages"] and question["reply"] == '{"same": [true]}'
    assert question["usage"] == {"prompt": 100, "completion": 50}


# ---------------------------------------------------------------- 13. a sweep parent's means


def test_a_sweep_parents_means_are_over_its_finished_jobs_and_a_failed_job_is_counted(tmp_path):
    from reflact.running.rundir import RunDir, SweepDir
    from reflact.sweeps.jobs import parent_metrics, sweep_jobs

    uri = "sqlite:///s.db"
    for number, (status, kept) in enumerate([("FINISHED", 2), ("FAILED", 30), ("FINISHED", 4)]):
        rd = RunDir(tmp_path / f"reflect.seed={number}")
        rd.root.mkdir()
        rd.write_mlflow_record({"run_id": str(number), "tracking_uri": uri, "status": status})
        rd.write_summary({"counts": {"calls": 1, "edits_kept": kept, "cost_usd": 0.25}})
        rd.write_analysis({"edits": kept, "redundancy": kept / 40, "agreement": kept / 80})
    metrics = parent_metrics(sweep_jobs(SweepDir(tmp_path), uri), 0)
    assert (metrics["jobs"], metrics["jobs_finished"], metrics["jobs_failed"]) == (3, 2, 1)
    assert metrics["edits_kept_mean"] == 3.0  # (2 + 4) / 2: the failed job's 30 is no result
    assert (metrics["redundancy_mean"], metrics["agreement_mean"]) == (pytest.approx(0.075), pytest.approx(0.0375))
    assert (metrics["calls_sum"], metrics["cost_usd_sum"]) == (3.0, 0.75)  # what was spent counts every job


# ---------------------------------------------------------------- issue 36: the end's waits count from the last reply


@pytest.mark.parametrize("ago_s,waits_from_ago_s", [(3.0, 3.0), (30.0, 5.0), (None, 0.0)])
def test_the_ends_waits_count_from_the_last_reply_at_most_half_the_deadline_ago(ago_s, waits_from_ago_s):
    """mlflow.deadline_s=10: a stage that ended 3 s ago (its summary's end) leaves the store 7 s
    more; after a 30 s analysis it still gets 5 s (half); without a summary the wait starts now."""
    import time

    from reflact.tracking.live import waits_from

    summary = None if ago_s is None else {"times": {"started_at": time.time() - 60, "ended_at": time.time() - ago_s}}
    before = time.monotonic()
    start = waits_from(summary, 10.0)
    assert before - waits_from_ago_s - 0.5 <= start <= time.monotonic() - waits_from_ago_s


# ---------------------------------------------------------------- the cap's worst case and cut-off replies (mutants)


def test_a_requests_worst_case_is_every_byte_plus_8_per_message_and_the_whole_allowance():
    from reflact.config import Price
    from reflact.running.ask import worst_cost

    messages = [{"role": "system", "content": "abc"}, {"role": "user", "content": "é"}]  # 3 and 2 bytes
    assert worst_cost(messages, 1000, Price(input=1, cached_input=0.1, output=4)) == pytest.approx(
        ((3 + 8) + (2 + 8) + 4 * 1000) / 1e6)


def test_the_cap_counts_a_worst_case_at_the_dearest_tier_that_may_serve_it():
    from dataclasses import replace

    from reflact.config import BatchReasks, Execution, ServiceTier
    from reflact.running.ask import cap_price

    o = make_config(*OFFLINE, "+optimizer.prices.test={input:1,cached_input:0.2,output:4}").optimizer
    amounts = lambda price: (price.input, price.cached_input, price.output)  # noqa: E731
    assert amounts(cap_price(replace(o, service_tier=ServiceTier.flex))) == (0.5, 0.1, 2.0)
    # flex may fall back to auto: the listed price
    assert amounts(cap_price(replace(o, service_tier=ServiceTier.flex, flex_fallback_after=2))) == (1, 0.2, 4)
    batch = replace(o, execution=Execution.batch)
    assert amounts(cap_price(replace(batch, batch_reasks=BatchReasks.batch))) == (0.5, 0.1, 2.0)
    assert amounts(cap_price(replace(batch, batch_reasks=BatchReasks.live))) == (1, 0.2, 4)  # re-asks go live
    # amount by amount: a tier's own price dearer in one amount, the listed one in the others
    own = make_config(*OFFLINE, "+optimizer.prices.test={input:1,cached_input:0.2,output:4,flex:{input:3,output:1}}")
    fallback = replace(own.optimizer, service_tier=ServiceTier.flex, flex_fallback_after=2)
    assert amounts(cap_price(fallback)) == (3, 0.2, 4)


def test_a_cut_off_reply_is_asked_again_with_twice_the_allowance_up_to_the_ceiling(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=1, n_succ=0)
    cut = iter([Response(body=chat_body("{", finish_reason="length"))] * 2)
    server.script = lambda request, number: next(cut, None)
    done = run(tmp_path, "run", *settings(server, data, "optimizer.max_output_tokens=40000",
                                          "optimizer.max_output_tokens_ceiling=64000", "reflect.max_reasks=3"))
    assert [r["max_completion_tokens"] for r in server.requests] == [40000, 64000, 64000]
    assert done.summary["counts"]["minibatches_done"] == 1 and done.summary["counts"]["reasks"] == 2


def test_a_rerun_that_makes_no_request_leaves_its_finished_mlflow_run_as_it_is(tmp_path, server, migrated_store):
    import reflact

    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=0)
    store = tmp_path / "live.db"
    shutil.copy(migrated_store, store)
    overrides = [*[o for o in settings(server, data) if not o.startswith(("data.dir", "mlflow."))],
                 f"mlflow.tracking_uri=sqlite:///{store}"]
    first = reflact.reflect(data, overrides=overrides, run_dir=tmp_path / "run", launch_dir=tmp_path)
    again = reflact.reflect(data, overrides=overrides, run_dir=tmp_path / "run", launch_dir=tmp_path)
    assert server.count == 2 and again.summary["counts"]["minibatches_reused"] == 2
    assert first.mlflow_run_id and again.mlflow_run_id == first.mlflow_run_id
