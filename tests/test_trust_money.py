"""Money and the analysis's calls (issue 36): the cost cap never hangs a worker on a float residue and
refuses at once what cannot fit once nothing is in flight; the analysis's calls cost at most their
worst case; an embeddings reply is read without trusting it (one dimension per analysis, finite
numbers, usage counted by the stage's rule)."""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import threading
from contextlib import closing

import numpy as np
import pytest

from reflact.analysis.embedding import AnalysisUnavailable
from reflact.analysis.judge import MARKER
from reflact.analysis.matchers import matcher_for
from reflact.analysis.vectors import Damaged, reply_rows
from reflact.config import parts as config_parts
from reflact.orchestration.experiment import Launch, RunResult, run_experiment
from reflact.running.ask import Spend
from reflact.testing.optimizer_server import Response, chat_body, default_reply, embedding_body, judge_reply
from tests.conftest import make_config, ok, run_cli, stage_for, summary_of, write_dataset

PRICED = "+optimizer.prices.test={input:1,cached_input:0.1,output:4}"

# ---------------------------------------------------------------- the cost cap's arithmetic


def reserve_in_thread(spend: Spend, worst: float, stopping: threading.Event, timeout_s: float = 10.0) -> bool:
    """spend.reserve(worst), failing the test (not hanging it) when it does not return."""
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(spend.reserve(worst, stopping)), daemon=True)
    waiter.start()
    waiter.join(timeout_s)
    stopping.set()  # releases a waiter that hangs, so the test process can end
    assert result, f"reserve({worst}) was still waiting with nothing in flight"
    return result[0]


def test_overlapping_reservations_leave_no_residue_that_keeps_a_refusal_waiting():
    # the minimal repro: four requests in flight at once, each settled below its worst case
    spend = Spend(0.5)
    for _ in range(4):
        assert spend.reserve(0.11, threading.Event())
    for _ in range(4):
        spend.settle(0.11, 0.1)
    assert spend.reserved == 0 and spend.spent == pytest.approx(0.4)
    assert reserve_in_thread(spend, 0.11, threading.Event()) is False  # cannot fit, nothing to wait for
    assert reserve_in_thread(spend, 0.1, threading.Event()) is True  # exactly fits: 0.4 + 0.1 = 0.5


@pytest.mark.parametrize(("costs", "limit", "last"), [
    ((0.1, 0.2), 0.6, 0.3),  # 0.1 + 0.2 + 0.3 is 0.6000000000000001 in floats
    ((0.7,) * 3, 2.8, 0.7),
    ((0.1,) * 10, 1.1, 0.1),
])
def test_a_request_that_exactly_fits_beside_what_was_spent_may_start(costs, limit, last):
    spend = Spend(limit)
    for cost in costs:
        assert spend.reserve(cost, threading.Event())
        spend.settle(cost, cost)
    assert reserve_in_thread(spend, last, threading.Event()) is True


def test_amounts_of_any_finite_size_are_counted():
    spend = Spend(1e300)  # a cap meant as "none"
    assert spend.reserve(1e299, threading.Event())
    spend.settle(1e299, 1e299)
    assert not spend.reserve(1e300, threading.Event()) and spend.spent == 1e299


def test_what_an_analysis_may_spend_is_the_cap_less_the_runs_spend_exactly():
    spend = Spend(0.7, spent=0.6)  # 0.7 - 0.6 is 0.09999999999999998 in floats
    assert spend.reserve(0.1, threading.Event())
    spend.settle(0.1, 0.1)
    assert not spend.reserve(1e-6, threading.Event())


# 40 draws of one minibatch at $0.10 a reply, each reserving its worst case of $0.11 (110 output
# tokens at $1000 a million; input is free): four fit at once under $0.50, the others cannot
CAP_REPRO = ["optimizer.samples=40", "optimizer.temperature=1", "reflect.workers=64", "reflect.minibatch_size=4",
             "optimizer.max_cost_usd=0.5", "optimizer.max_output_tokens=110",
             "+optimizer.prices.test={input:0,cached_input:0,output:1000}", "optimizer.cache=off"]


def test_a_run_at_its_cost_cap_refuses_what_cannot_fit_and_ends(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=4, n_succ=0)
    # slow replies, so the first four requests are in flight together and settle in any order
    server.script = lambda request, number: Response(
        body=chat_body(json.dumps(default_reply(request)), completion_tokens=100), delay_s=0.3)
    done = run_cli(f"data.dir={data}", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
                   "mlflow.enabled=false", f"hydra.run.dir={tmp_path / 'run'}", *CAP_REPRO, cwd=tmp_path, timeout=90)
    ok(done)
    counts = summary_of(tmp_path / "run")["counts"]
    assert server.count == 4 and counts["spent_usd"] == pytest.approx(0.4)
    assert counts["minibatches_not_run"] == 36


def test_a_request_that_fails_with_a_bug_leaves_no_reservation_for_others_to_wait_on(tmp_path, server):
    class Buggy:
        fault = ""

        def complete(self, *args, **kwargs):
            raise TypeError("a bug in an optimizer of one's own")

        def ready(self):
            pass

        def forget(self, replies):
            pass

        def close(self):
            pass

    data = write_dataset(tmp_path / "d", n_fail=1, n_succ=0)
    stage = stage_for(tmp_path, server, data, "reflect.minibatch_size=1", PRICED, "optimizer.max_cost_usd=1",
                      optimizer=Buggy())
    with pytest.raises(TypeError, match="a bug"):
        stage.run()
    assert reserve_in_thread(stage.asker.spend, 2.0, threading.Event()) is False  # nothing is left in flight


# ---------------------------------------------------------------- the embeddings, read without trust

EMBEDDING = ["analysis.matcher=embedding", "analysis.embedding.model=emb", "+optimizer.prices.emb={input:0.02}"]


def spread(text: str, dimension: int = 8) -> list[float]:
    """A text's made-up vector: the same text, the same vector."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return [digest[i] / 255 - 0.5 for i in range(dimension)]


class Embeddings:
    """A server script: /embeddings answered with `vector(text, request number)` for each text and
    `tokens` as its usage; chat requests (the stage's, the judge's) go to `chat`, else the defaults."""

    def __init__(self, vector=lambda text, number: spread(text), tokens: object = 8, chat=None) -> None:
        self.vector, self.tokens, self.chat = vector, tokens, chat
        self.asked: list[list[str]] = []

    def __call__(self, request: dict, number: int):
        if "input" not in request:
            return self.chat(request) if self.chat else None
        self.asked.append(list(request["input"]))
        vectors = [self.vector(text, len(self.asked)) for text in request["input"]]
        return Response(body=embedding_body(vectors, self.tokens))

    def texts(self) -> list[str]:
        return [text for batch in self.asked for text in batch]


def analysed(tmp_path, server, name: str, *overrides: str) -> RunResult:
    """A run through the stand-in (the stage and the embeddings), analysed by the embedding matcher."""
    data = tmp_path / "d" if (tmp_path / "d").exists() else write_dataset(tmp_path / "d", n_fail=8, n_succ=4)
    cfg = make_config(f"data.dir={data}", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
                      "mlflow.enabled=false", "reflect.minibatch_size=4", "optimizer.temperature=1",
                      "optimizer.samples=2", *EMBEDDING, *overrides)
    return run_experiment(config_parts(cfg), {}, tmp_path / name, Launch(tmp_path))


def warnings_about(caplog, text: str) -> int:
    return sum(text in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


def test_embeddings_of_unequal_length_in_one_reply_leave_the_analysis_out_and_the_run_finishes(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=8, n_succ=4)
    lengths = itertools.cycle([8, 5])  # rows of 8 and 5 numbers in turn
    server.script = Embeddings(lambda text, number: spread(text, next(lengths)))
    done = run_cli(f"data.dir={data}", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
                   "mlflow.enabled=false", f"hydra.run.dir={tmp_path / 'run'}", "reflect.minibatch_size=4",
                   PRICED, *EMBEDDING, cwd=tmp_path, timeout=120)
    printed = ok(done)
    analysis = json.loads((tmp_path / "run" / "analysis.json").read_text())
    assert "unequal lengths (5, 8 numbers)" in analysis["skipped"] and analysis["edits"] > 0
    warned = [line for line in printed.splitlines() if "[WARNING]" in line]
    assert "Traceback" not in printed and len(warned) == 1 and "unequal lengths" in warned[0]
    assert analysis["analysis_calls"]["embedding"]["requests"] == 1


def test_a_dimension_that_changes_between_requests_leaves_the_analysis_out_and_nothing_in_the_cache(
        tmp_path, server, caplog):
    server.script = first = Embeddings(lambda text, number: spread(text, 8 if number == 1 else 4))
    done = analysed(tmp_path, server, "changing", "analysis.embedding.batch=1")
    assert done.status == "FINISHED" and "vectors of 4 and 8 numbers in one analysis" in done.analysis["skipped"]
    assert len(first.asked) == 2 and warnings_about(caplog, "4 and 8 numbers") == 1  # stopped at the first change
    # the two vectors it was given are not kept: a new analysis asks for every text again
    server.script = again = Embeddings(lambda text, number: spread(text, 4))
    redone = analysed(tmp_path, server, "steady", "analysis.embedding.batch=1")
    assert "skipped" not in redone.analysis and redone.analysis["analysis_calls"]["embedding"]["cache_hits"] == 0
    assert set(first.texts()) <= set(again.texts())


def embedder_for(tmp_path, server):
    cfg = make_config("data.dir=x", f"optimizer.base_url={server.base_url}", "optimizer.model=test", *EMBEDDING)
    chosen = matcher_for(cfg.analysis, cfg.optimizer, tmp_path, environ={})
    return chosen, chosen.matcher.embedder


def test_an_analysis_may_spend_only_what_the_run_left_of_the_cap(tmp_path, server):
    server.script = asked = Embeddings()
    cfg = make_config("data.dir=x", f"optimizer.base_url={server.base_url}", "optimizer.model=test", PRICED,
                      *EMBEDDING, "optimizer.max_cost_usd=1", "optimizer.cache=off")
    worst = embedding_worst(["a"])  # $0.02 a million: 9 tokens at most
    for spent, fits in [(1 - worst, True), (1 - worst / 2, False)]:
        chosen = matcher_for(cfg.analysis, cfg.optimizer, tmp_path, spent, environ={})
        with closing(chosen):
            if fits:
                assert chosen.matcher.embedder.vectors(["a"]).shape == (1, 8)
            else:
                with pytest.raises(AnalysisUnavailable, match="cost limit optimizer.max_cost_usd leaves no room"):
                    chosen.matcher.embedder.vectors(["a"])
    assert asked.texts() == ["a"]


def test_vectors_cached_from_another_model_by_the_same_name_are_not_compared_with_new_ones(tmp_path, server):
    server.script = Embeddings(lambda text, number: spread(text, 8))
    chosen, embedder = embedder_for(tmp_path, server)
    with closing(chosen):
        assert embedder.vectors(["a", "b"]).shape == (2, 8)
        server.script = now = Embeddings(lambda text, number: spread(text, 4))  # another model behind the name
        with pytest.raises(AnalysisUnavailable, match="vectors of 4 and 8 numbers"):
            embedder.vectors(["a", "c"])
        assert now.texts() == ["c"]
        assert embedder.vectors(["a", "c"]).shape == (2, 4)  # "a" was dropped from the cache: asked again
        assert now.texts() == ["c", "a", "c"]


def test_a_nan_embedding_is_a_damaged_reply_never_used_or_cached(tmp_path, server, caplog):
    server.script = nan = Embeddings(lambda text, number: [math.nan] + spread(text)[1:])
    done = analysed(tmp_path, server, "nan")
    assert done.status == "FINISHED" and done.summary["counts"]["edits_kept"] > 0
    assert "damaged: an embedding is not a list of finite numbers" in done.analysis["skipped"]
    assert warnings_about(caplog, "not a list of finite numbers") == 1
    server.script = sane = Embeddings()
    redone = analysed(tmp_path, server, "sane")
    assert "skipped" not in redone.analysis and redone.analysis["analysis_calls"]["embedding"]["cache_hits"] == 0
    assert sane.texts() == nan.texts()


def test_a_damaged_cached_vector_is_a_miss_and_asked_for_again(tmp_path, server):
    server.script = asked = Embeddings()
    chosen, embedder = embedder_for(tmp_path, server)
    with closing(chosen):
        embedder.cache.put(embedder._key("a"), {"vector": [math.nan] * 8})  # as an earlier version kept it
        embedder.cache.put(embedder._key("b"), {"vector": spread("b")})
        rows = embedder.vectors(["a", "b"])
    assert asked.texts() == ["a"] and embedder.spent.cache_hits == 1
    assert np.isfinite(rows).all() and np.allclose(np.linalg.norm(rows, axis=1), 1)


@pytest.mark.parametrize("damage", [
    {"embedding": [math.nan, 1.0]}, {"embedding": [math.inf, 1.0]}, {"embedding": ["0.5", 1.0]},
    {"embedding": []}, {"embedding": None}, {"embedding": [[1.0], [2.0]]}, {"embedding": [10**400, 1.0]},
    {"index": 5}, {"index": True}, {"index": None},
], ids=["nan", "infinity", "text", "empty", "null", "nested", "huge integer", "index out of range",
        "index a boolean", "index missing"])
def test_a_reply_row_that_is_not_finite_numbers_at_its_index_is_damaged(damage):
    body = {"data": [{"index": 0, "embedding": [0.0, 1.0]}, {"index": 1, "embedding": [1.0, 0.0], **damage}]}
    with pytest.raises(Damaged):
        reply_rows(body, 2)


def test_finite_vectors_of_any_magnitude_become_unit_rows_in_the_texts_order():
    body = {"data": [{"index": 1, "embedding": [3e300, 4e300]}, {"index": 0, "embedding": [0, 2]}]}
    raw, rows = reply_rows(body, 2)
    assert raw == [[0, 2], [3e300, 4e300]]
    assert np.allclose(np.stack(rows), [[0, 1], [0.6, 0.8]])


# ---------------------------------------------------------------- usage and cost of the analysis's calls

def embedding_worst(texts: list[str], price_per_million: float = 0.02) -> float:
    return sum(len(t.encode("utf-8")) + 8 for t in texts) * price_per_million / 1e6


@pytest.mark.parametrize(("tokens", "warned"), [
    (10**12, "usage.prompt_tokens is implausibly large"), (10**9, "an embeddings reply claims usage worth"),
    ("twelve", "usage.prompt_tokens is a string"), ([12], "usage.prompt_tokens is a list"),
], ids=["past any count", "past the worst case", "text", "a list"])
def test_an_embeddings_replys_usage_is_read_by_the_stages_rule_and_costs_at_most_its_worst_case(
        tmp_path, server, caplog, tokens, warned):
    server.script = asked = Embeddings(tokens=tokens)
    done = analysed(tmp_path, server, "usage", "optimizer.max_cost_usd=1", PRICED)
    assert done.status == "FINISHED" and "skipped" not in done.analysis
    calls = done.analysis["analysis_calls"]["embedding"]
    assert calls["requests"] == len(asked.asked) >= 1
    assert calls["cost_usd"] <= round(sum(embedding_worst(batch) for batch in asked.asked), 6)
    assert warnings_about(caplog, warned) >= 1


def test_a_judges_absurd_usage_costs_at_most_its_worst_case_and_its_next_questions_are_asked(
        tmp_path, server, caplog):
    def absurd(request):  # the stand-in's judge, claiming 10^9 tokens each way ($5,000 at this price)
        verdicts = judge_reply(request)
        if verdicts is None:
            return None
        text = verdicts["choices"][0]["message"]["content"]
        return Response(body=chat_body(text, prompt_tokens=10**9, completion_tokens=10**9))

    server.script = Embeddings(lambda text, number: [1.0] * 8, chat=absurd)  # every pair is a candidate
    done = analysed(tmp_path, server, "judge", "analysis.matcher=judge", "analysis.judge.batch=2",
                    "optimizer.max_cost_usd=1", PRICED)
    judged = [r for r in server.requests if "messages" in r and MARKER in r["messages"][0]["content"]]
    assert "skipped" not in done.analysis and len(judged) >= 2
    calls = done.analysis["analysis_calls"]["judge"]
    assert calls["requests"] == len(judged) and 0 < calls["cost_usd"] < 1
    assert warnings_about(caplog, "a judge's reply claims usage worth") == len(judged)
