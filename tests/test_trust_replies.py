"""What a server sends reaches disk, the cache and MLflow safely (issue 22): unencodable text is
repaired, a failing cache degrades to no cache, keys quoted back in a reply are redacted,
absurd usage never raises the recorded spend past what the request could cost, a bug in the
client is a bug, and a number and its digits name the same trajectory."""

from __future__ import annotations

import json
import logging
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reflact.calls import client as client_module
from reflact.calls.cache import ResponseCache
from reflact.calls.completion import MalformedReply, read_completion
from reflact.config import CacheMode
from reflact.config import parts as config_parts
from reflact.core.files import repair_text, write_json, write_text
from reflact.core.modes import get_mode
from reflact.inputs.importers import import_runs
from reflact.orchestration.experiment import Launch, run_experiment
from reflact.replies.parse import ParseError, extract_object
from reflact.replies.patches import CheckedReply, ReplyError, check_reply
from reflact.replies.provenance import with_support_ids
from reflact.running import ask as ask_module
from reflact.running.ask import worst_cost
from reflact.testing.optimizer_server import Response, chat_body, default_reply
from tests.conftest import make_config, patches_of, write_dataset
from tests.conftest import stage_for as shared_stage_for

ONE_EACH = "reflect.minibatch_size=1"  # a minibatch, so a request, per run
HALF_EMOJI = "\ud83d"  # the high half of U+1F600, as a model emits it when an emoji is cut


def stage_for(tmp_path, server, data, *overrides, **kwargs):
    return shared_stage_for(tmp_path, server, data, ONE_EACH, *overrides, **kwargs)


def utf8(path: Path) -> str:
    return path.read_bytes().decode("utf-8")  # strict: raises on anything that is not UTF-8


def escaped_reply(request: dict, text: str) -> Response:
    """The default reply with `text` in its first item, JSON-escaped into the content (so a lone
    surrogate travels as the six characters \\ud83d, as a model writes it)."""
    reply = default_reply(request)
    reply["patch"]["edits"][0]["content"] = text
    return Response(body=chat_body(json.dumps(reply)))


# ---------------------------------------------------------------- unencodable text


@pytest.mark.parametrize(("text", "written"), [
    (f"a{HALF_EMOJI}b", "a\ufffdb"),
    ("a\ude00b", "a\ufffdb"),  # a lone low half
    ("\ud83d\ude00", "\U0001f600"),  # a pair split in two code points is joined
    (f"{HALF_EMOJI}{HALF_EMOJI}\U0001f600", "\ufffd\ufffd\U0001f600"),
    ("plain é 😀", "plain é 😀"),
])
def test_the_writer_repairs_unencodable_text_instead_of_failing(tmp_path, text, written):
    write_text(tmp_path / "a.txt", text)
    write_json(tmp_path / "a.json", {text: [text]})
    assert utf8(tmp_path / "a.txt") == written == repair_text(text)
    assert json.loads(utf8(tmp_path / "a.json")) == {written: [written]}
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("where", ["inside the reply's JSON", "in the body's JSON"])
def test_a_lone_surrogate_in_a_reply_is_saved_repaired_and_replays_from_the_cache(tmp_path, server, where):
    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=0)
    if where == "inside the reply's JSON":  # the model's text holds the escape: \\ud83d
        server.script = lambda request, number: escaped_reply(request, f"- keep calm {HALF_EMOJI}")
    else:  # the body's JSON does: the content itself carries the lone half
        server.script = lambda request, number: Response(
            body=json.dumps(chat_body(json.dumps(default_reply(request))[:-1] + f', "x": "{HALF_EMOJI}"}}')))
    cache = ["optimizer.cache=read_write", f"optimizer.cache_path={tmp_path / 'cache.db'}"]
    for run in ("first", "rerun from the cache"):
        outcomes = stage_for(tmp_path, server, data, *cache, run_dir=tmp_path / run).run()
        assert [o.status for o in outcomes] == ["done"] * 2, run
        for path in (tmp_path / run).rglob("*"):
            if path.is_file():
                assert HALF_EMOJI not in utf8(path)
    assert server.count == 2  # the rerun was answered by the cache, and did not crash on it
    if where == "inside the reply's JSON":
        patch = patches_of(tmp_path / "rerun from the cache")["minibatch_fail_000"]
        assert patch["patch"]["edits"][0]["content"] == "- keep calm \ufffd"


def test_the_api_returns_the_patches_as_saved_repaired_and_in_plan_order(tmp_path, server):
    """The patches reflect() returns are the ones in patches/ (not read back: passed on in memory),
    a lone surrogate repaired as on disk, in plan order, on the first run and on a rerun that
    reuses them all."""
    import reflact

    data = write_dataset(tmp_path / "d", n_fail=4, n_succ=2)
    server.script = lambda request, number: escaped_reply(request, f"- keep calm {HALF_EMOJI}")
    point = ["optimizer=compatible", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
             "reflect.minibatch_size=2", "mlflow.enabled=false", "optimizer.cache=off"]
    for run in ("first", "rerun"):
        done = reflact.reflect(data, overrides=point, run_dir=tmp_path / "run", launch_dir=tmp_path)
        assert list(done.patches) == ["minibatch_fail_000", "minibatch_fail_001", "minibatch_succ_000"], run
        assert done.patches == patches_of(tmp_path / "run"), run
        assert {p["patch"]["edits"][0]["content"] for p in done.patches.values()} == {"- keep calm \ufffd"}
    assert server.count == 3 and done.summary["counts"]["minibatches_reused"] == 3


def test_results_and_imports_with_lone_surrogates_are_written(tmp_path):
    log = tmp_path / "log.jsonl"
    run = {"id": "r1", "score": 0, "task": f"cut {HALF_EMOJI}",
           "messages": [{"role": "system", "content": f"skill {HALF_EMOJI}"},
                        {"role": "user", "content": f"hi {HALF_EMOJI}"}, {"role": "assistant", "content": "ok"}]}
    log.write_text(json.dumps(run) + "\n", encoding="utf-8")  # json escapes the half: a valid file
    import_runs("chat_jsonl", log, tmp_path / "out")
    for path in (tmp_path / "out").rglob("*"):
        if path.is_file():
            assert "\ufffd" in utf8(path), path


def test_api_inputs_with_lone_surrogates_are_written(tmp_path):
    from reflact.api import python_inputs

    cfg = make_config(f"data.dir={tmp_path}", "optimizer.base_url=http://127.0.0.1:9", "optimizer.model=test")
    results = [{"id": "r1", "hard": 0, "task_description": f"cut {HALF_EMOJI}"}]
    inputs = python_inputs(results, f"# skill {HALF_EMOJI}", {"r1": [{"role": "user", "content": f"hi {HALF_EMOJI}"}]},
                           None)
    inputs.write(cfg, tmp_path / "in")
    for name in ("skill.md", "results.jsonl", "predictions/r1/conversation.json"):
        assert "\ufffd" in utf8(tmp_path / "in" / name), name


# ---------------------------------------------------------------- the cache is an optimisation


def cached_stage(tmp_path, server, data, cache_path: Path, caplog):
    caplog.set_level(logging.WARNING, logger="reflact")
    return stage_for(tmp_path, server, data, "optimizer.cache=read_write", f"optimizer.cache_path={cache_path}")


def cache_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "response cache" in r.getMessage()]


@pytest.mark.parametrize("damage", ["a folder", "garbage", "a file as its folder"])
def test_a_cache_that_cannot_be_opened_is_one_warning_and_no_cache(tmp_path, server, caplog, damage):
    data = write_dataset(tmp_path / "d", n_fail=3, n_succ=0)
    path = tmp_path / "cache.db"
    if damage == "a folder":
        path.mkdir()
    elif damage == "garbage":
        path.write_bytes(b"this is not a database\x00" * 200)
    else:
        path.write_text("a file")
        path = path / "cache.db"
    outcomes = cached_stage(tmp_path, server, data, path, caplog).run()
    assert [o.status for o in outcomes] == ["done"] * 3 and server.count == 3
    assert len(cache_warnings(caplog)) == 1


def test_a_cache_write_locked_past_its_timeout_keeps_the_paid_reply(tmp_path, server, caplog):
    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=0)
    path = tmp_path / "cache.db"
    stage = cached_stage(tmp_path, server, data, path, caplog)
    stage.asker.optimizer.cache = ResponseCache(path, CacheMode.read_write, timeout_s=0.1)
    with closing(sqlite3.connect(path, isolation_level=None)) as other:
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock while the requests are out
        outcomes = stage.run()
        other.execute("ROLLBACK")
    assert [o.status for o in outcomes] == ["done"] * 2 and server.count == 2
    assert len(patches_of(tmp_path / "run")) == 2
    assert sorted(p.parent.name for p in (tmp_path / "run" / "calls").glob("*/reply_*.txt")) == [
        "minibatch_fail_000", "minibatch_fail_001"]
    [warning] = cache_warnings(caplog)
    assert "locked" in warning


def test_a_cache_entry_that_is_not_a_reply_is_a_miss(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=1, n_succ=0)
    path = tmp_path / "cache.db"
    stage_for(tmp_path, server, data, "optimizer.cache=read_write", f"optimizer.cache_path={path}").run()
    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        [(key, _)] = db.execute("SELECT key, reply FROM replies").fetchall()
    for number, garbage in enumerate(["not json", "[1]", '{"text": 5}', '{"text": "t", "usage": {"prompt": -1}}',
                    '{"text": "t", "usage": {"tokens": 1}}', '{"text": "t", "finish_reason": 3}']):
        with closing(sqlite3.connect(path, isolation_level=None)) as db:
            db.execute("UPDATE replies SET reply = ? WHERE key = ?", (garbage, key))
        before = server.count
        outcomes = stage_for(tmp_path, server, data, "optimizer.cache=read",
                             f"optimizer.cache_path={path}", run_dir=tmp_path / f"again{number}").run()
        assert outcomes[0].status == "done" and server.count == before + 1, garbage


# ---------------------------------------------------------------- keys quoted back in a 200 reply

KEY = "sk-proj-" + "Qx7" * 10


@pytest.mark.parametrize("provider", ["openai", "azure"])
def test_a_key_quoted_back_in_a_reply_is_in_no_file_of_the_run(tmp_path, server, launch_dir, monkeypatch, provider):
    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=0)
    # the key as is, JSON-escaped, and its tail: in an item, the reasoning and beside the object
    quoted = f"your key {KEY} ({json.dumps(KEY)[1:-1]}) ends in {KEY[-8:]}"

    def script(request, number):
        reply = default_reply(request)
        reply["patch"]["edits"][0]["content"] = f"- {quoted}"
        reply["patch"]["reasoning"] = quoted
        return Response(body=chat_body(json.dumps(reply) + f"\n{quoted}"))

    server.script = script
    where = [f"optimizer.base_url={server.base_url}"]
    if provider == "azure":
        where = ["optimizer=azure", "optimizer.base_url=null", "optimizer.azure.deployment=dep",
                 f"optimizer.azure.endpoint={server.base_url.removesuffix('/v1')}"]
    cfg = make_config(f"data.dir={data}", *where, ONE_EACH, "optimizer.model=test", "optimizer.cache=read_write",
                      f"optimizer.cache_path={launch_dir / 'outputs' / 'cache.db'}",
                      f"mlflow.tracking_uri=sqlite:///{launch_dir / 'outputs' / 'mlflow.db'}")
    monkeypatch.setenv("AZURE_OPENAI_API_KEY" if provider == "azure" else "OPENAI_API_KEY", KEY)
    result = run_experiment(config_parts(cfg), {}, tmp_path / "run", Launch(launch_dir))
    assert result.summary["counts"]["minibatches_done"] == 2 and server.count == 2
    assert (tmp_path / "run" / "report.md").is_file()
    written = [p for folder in (tmp_path / "run", launch_dir) for p in folder.rglob("*") if p.is_file()]
    assert any(p.name == "cache.db" for p in written) and any(p.name == "mlflow.db" for p in written)
    for path in written:
        assert KEY[-8:].encode() not in path.read_bytes(), path
    patch = patches_of(tmp_path / "run")["minibatch_fail_000"]
    assert patch["patch"]["edits"][0]["content"] == "- your key *** (***) ends in ***"


# ---------------------------------------------------------------- recorded spend


PRICED = "+optimizer.prices.test={input:1,cached_input:0.1,output:4}"


def test_absurd_usage_is_recorded_as_at_most_what_the_request_could_cost(tmp_path, server, caplog):
    data = write_dataset(tmp_path / "d", n_fail=1, n_succ=1)
    absurd = 10**9  # the largest count read as plausible: $1000s a call at this price
    server.script = lambda request, number: Response(body=chat_body(
        json.dumps(default_reply(request)), prompt_tokens=absurd, completion_tokens=absurd))
    caplog.set_level(logging.WARNING, logger="reflact")
    stage = stage_for(tmp_path, server, data, PRICED, "optimizer.max_cost_usd=1")
    outcomes = stage.run()
    assert [o.status for o in outcomes] == ["done", "done"]
    for outcome in outcomes:
        messages = [{"role": "system", "content": stage.run_dir.system_path(outcome.tag).read_text("utf-8")},
                    {"role": "user", "content": stage.run_dir.user_path(outcome.tag, 1).read_text("utf-8")}]
        worst = worst_cost(messages, stage.settings.optimizer.max_output_tokens, stage.asker.price)
        assert 0 < outcome.spent_usd == outcome.cost_usd == pytest.approx(worst)
    assert stage.asker.spend.spent <= 1.0
    assert sum("more than the request could cost" in r.getMessage() for r in caplog.records) == 2


def test_plausible_usage_is_recorded_as_it_was_priced(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=1, n_succ=0)
    [outcome] = stage_for(tmp_path, server, data, PRICED, "optimizer.max_cost_usd=1").run()
    # chat_body's usage: 100 prompt tokens of which 20 cached, 50 completion tokens
    assert outcome.spent_usd == pytest.approx((80 * 1 + 20 * 0.1 + 50 * 4) / 1e6)


# ---------------------------------------------------------------- a bug is a bug


def test_a_bug_inside_the_client_surfaces_with_its_traceback(tmp_path, server, monkeypatch):
    from tests.test_faults import MESSAGES, client_for

    def buggy(body, warn):
        raise TypeError("a bug in reading the reply")

    monkeypatch.setattr(client_module, "read_completion", buggy)
    with closing(client_for(tmp_path, server)) as client, pytest.raises(TypeError, match="a bug in reading"):
        client.complete(MESSAGES, 10)
    assert server.count == 1  # a bug is not retried either


def test_a_bug_on_a_reply_drops_it_from_the_cache(tmp_path, server, monkeypatch):
    data = write_dataset(tmp_path / "d", n_fail=1, n_succ=0)
    cache = ["optimizer.cache=read_write", f"optimizer.cache_path={tmp_path / 'cache.db'}"]

    def buggy(*args):
        raise TypeError("a bug in checking the reply")

    with monkeypatch.context() as patched:
        patched.setattr(ask_module, "check_reply", buggy)
        with pytest.raises(TypeError, match="a bug in checking"):
            stage_for(tmp_path, server, data, *cache).run()
    [outcome] = stage_for(tmp_path, server, data, *cache, run_dir=tmp_path / "fixed").run()
    assert outcome.status == "done" and outcome.cache_hits == 0 and server.count == 2


# ---------------------------------------------------------------- provenance: 1 and "1"


def supported(ids: list[str], support: object) -> list[str]:
    mode = get_mode("patch")
    checked = CheckedReply({"patch": {"edits": [{"op": "append", "content": "- x",
                                                 "supporting_trajectories": support}]}}, 1, 1)
    return with_support_ids(checked, mode, ids).obj["patch"]["edits"][0]["supporting_ids"]


@pytest.mark.parametrize("ids", [["3", "1", "2"], ["17", "42"], ["run_a", "run_b", "run_c"], ["2", "1"]])
def test_a_number_and_its_digits_name_the_same_trajectory(ids):
    for position in range(1, len(ids) + 1):
        forms = [position, str(position), f" {position} ", float(position)]
        assert {tuple(supported(ids, [form])) for form in forms} == {(ids[position - 1],)}


def test_an_id_shown_is_accepted_and_its_number_form_too():
    assert supported(["17", "42"], ["42"]) == supported(["17", "42"], [42]) == ["42"]
    assert supported(["run_a", "run_b"], ["run_b"]) == ["run_b"]
    for outside in [3, "3", 0, -1]:
        with pytest.raises(ReplyError, match="out of range"):
            supported(["17", "42"], [outside])


# ---------------------------------------------------------------- the reply path, fuzzed

TEXT = st.text(st.characters(blacklist_categories=()), max_size=40)  # surrogates included
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | TEXT,
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
                    max_leaves=30)
ITEM = st.fixed_dictionaries({"op": st.sampled_from(["append", "insert_after", "replace", "delete", 3]),
                              "content": JSON, "target": JSON}, optional={"supporting_trajectories": JSON})
REPLY = st.fixed_dictionaries({"failure_summary": JSON, "patch": st.fixed_dictionaries(
    {"reasoning": JSON, "edits": st.lists(ITEM, max_size=4) | JSON})}) | JSON


def reply_text(obj: object, wrap: int) -> str:
    text = json.dumps(obj, allow_nan=True)  # ASCII: every surrogate travels as an escape
    return [text, f"Here it is:\n```json\n{text}\n```\n", text[: len(text) // 2], f"{text} {text}"][wrap]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(obj=REPLY, wrap=st.integers(0, 3), content=st.sampled_from(["json", "raw"]))
def test_the_reply_path_takes_any_reply_without_a_traceback(tmp_path, obj, wrap, content):
    text = reply_text(obj, wrap)
    if content == "raw":  # the text itself as the content, lone surrogates and all
        text = obj if isinstance(obj, str) else text
    body = json.dumps(chat_body(text)).encode("utf-8")
    completion = read_completion(body, lambda field, what: None)
    write_text(tmp_path / "reply.txt", completion.text)
    try:
        checked = check_reply(extract_object(completion.text), get_mode("patch"), "failure", 3, False)
        checked = with_support_ids(checked, get_mode("patch"), ["1", "run_2", "3"])
    except (ParseError, ReplyError, MalformedReply):
        return
    write_json(tmp_path / "patch.json", checked.obj)
    assert isinstance(json.loads(utf8(tmp_path / "patch.json")), dict)


def test_the_fuzz_reaches_checked_patches():
    """The property above is not vacuous: replies of its shape do reach a written patch."""
    obj = {"failure_summary": [], "patch": {"reasoning": f"r{HALF_EMOJI}",
                                            "edits": [{"op": "append", "content": f"- a {HALF_EMOJI}",
                                                       "supporting_trajectories": ["1", 3]}]}}
    checked = check_reply(extract_object(reply_text(obj, 1)), get_mode("patch"), "failure", 3, False)
    edit = with_support_ids(checked, get_mode("patch"), ["1", "run_2", "3"]).obj["patch"]["edits"][0]
    assert edit["content"] == "- a \ufffd" and edit["supporting_ids"] == ["1", "3"]

