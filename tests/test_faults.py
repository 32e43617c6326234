"""The optimizer client's robustness against a misbehaving server (retries, re-asks, structured
output fallback, cache, cost limit, rate limit, dry run, malformed bodies, odd Retry-After
values, trickling replies, close() mid-call), through the real client and the loopback server of
reflact/testing/optimizer_server.py."""

from __future__ import annotations

import email.utils
import json
import logging
import re
import threading
import time
from collections import defaultdict
from contextlib import closing
from types import SimpleNamespace

import openai
import pytest

from reflact.calls import ratelimit
from reflact.calls.cache import ResponseCache
from reflact.calls.client import ABANDONED, is_transient, make_client, retry_after_s, wait_after
from reflact.calls.protocol import CallError, DryRunEstimator, Reply, Usage
from reflact.calls.ratelimit import Bucket, RateLimiter
from reflact.config import CacheMode
from reflact.config import parts as config_parts
from reflact.core.errors import UserError
from reflact.core.modes import get_mode
from reflact.inputs.dataset import load_dataset
from reflact.orchestration.experiment import Launch, run_experiment
from reflact.prompting.plan import plan_minibatches
from reflact.replies.patches import check_reply
from reflact.running.stage import Stage
from reflact.testing.optimizer_server import OptimizerServer, Response, chat_body, default_reply
from tests.conftest import make_config, stage_settings, write_dataset

try:  # the HTTP client the installed openai SDK is built on
    import httpx2 as httpx
except ImportError:  # pragma: no cover - older SDKs
    import httpx

# 24 failures + 16 successes with M=4: 6 + 4 = 10 minibatches
N_FAIL, N_SUCC, M = 24, 16, 4
N_MINIBATCHES = N_FAIL // M + N_SUCC // M
BUDGET = 4  # reflect.edit_budget's default; the server proposes L + 2
IDS = re.compile(r"^### Trajectory \d+ of \d+ \(id: (.+)\)$", re.M)


def config(tmp_path, server, dataset_dir, *overrides):
    """The config run_stage uses: tiny retry waits, response cache off unless turned on after."""
    return make_config(
        f"data.dir={dataset_dir}", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
        "optimizer.retry.initial_wait_s=0.01", "optimizer.retry.max_wait_s=0.05", "optimizer.cache=off",
        f"reflect.minibatch_size={M}", *overrides,
    )


def run_stage(tmp_path, server, dataset_dir, *overrides, run_dir=None):
    """The stage through the real client (the pattern of tests/test_stage.py)."""
    cfg = config(tmp_path, server, dataset_dir, *overrides)
    dataset = load_dataset(cfg.data)
    client = make_client(cfg.optimizer, tmp_path, environ={})
    stage = Stage(stage_settings(cfg), dataset, client, run_dir or tmp_path / "run")
    return stage.run()


def with_cache(tmp_path, mode="read_write"):
    return [f"optimizer.cache={mode}", f"optimizer.cache_path={tmp_path / 'cache.db'}"]


def conversation_key(request: dict) -> str:
    """The user message: one per minibatch, the same for its retries and its re-asks."""
    return request["messages"][1]["content"]


def requests_by_minibatch(server) -> dict[str, list[dict]]:
    grouped = defaultdict(list)
    for request in server.requests:
        grouped[conversation_key(request)].append(request)
    return grouped


class FailFirst:
    """A server script: the first request of every conversation gets `fault(request)`, the rest
    the default valid reply. Records when each request of a conversation arrived."""

    def __init__(self, fault) -> None:
        self.fault = fault
        self.seen: set[str] = set()
        self.arrivals: dict[str, list[float]] = defaultdict(list)
        self._lock = threading.Lock()

    def __call__(self, request: dict, number: int) -> Response | None:
        key = conversation_key(request)
        with self._lock:
            self.arrivals[key].append(time.monotonic())
            first = key not in self.seen
            self.seen.add(key)
        return self.fault(request) if first else None


def error_body(message: str) -> dict:
    return {"error": {"message": message, "type": "server_error", "code": None}}


def valid_text(request: dict) -> str:
    return json.dumps(default_reply(request))


FAULTS = {
    # name: (what the first attempt gets, which counter shows the extra request)
    "429_retry_after_0": (lambda r: Response(429, error_body("slow down"), {"Retry-After": "0"}), "retries"),
    "500": (lambda r: Response(500, error_body("boom")), "retries"),
    "502": (lambda r: Response(502, error_body("bad gateway")), "retries"),
    "503": (lambda r: Response(503, error_body("unavailable")), "retries"),
    "hang": (lambda r: Response(body=chat_body(valid_text(r)), delay_s=2.0), "retries"),
    "garbage": (lambda r: Response(body=chat_body("Sure! <<not json at all>> ]]} {{")), "reasks"),
    "truncated": (lambda r: Response(body=chat_body(valid_text(r)[: len(valid_text(r)) // 2],
                                                    finish_reason="length")), "reasks"),
}


def assert_all_valid(run_dir, outcomes, budget=BUDGET):
    assert len(outcomes) == N_MINIBATCHES
    mode = get_mode("patch")
    for o in outcomes:
        assert o.status == "done", (o.tag, o.error, o.parse)
        assert o.parse == "ok"
        patch = json.loads((run_dir / "patches" / f"{o.tag}.json").read_text())
        checked = check_reply(patch, mode, o.group, budget, notes_allowed=False)  # raises when invalid
        assert checked.kept == len(patch["patch"]["edits"]) == budget
        assert patch["trajectory_ids"] == o.ids and patch["source_type"] == o.group
        assert patch["n_analysed"] == len(o.ids) == M and patch["n_proposed"] == budget + 2


@pytest.fixture
def dataset(tmp_path):
    return write_dataset(tmp_path / "d", n_fail=N_FAIL, n_succ=N_SUCC)


# 1. the server fails the first attempt of every call -------------------------------------------


@pytest.mark.parametrize("fault", list(FAULTS))
def test_first_attempt_of_every_call_fails_costs_one_extra_request(tmp_path, server, dataset, fault):
    make_fault, counter = FAULTS[fault]
    script = FailFirst(make_fault)
    server.script = script
    overrides = with_cache(tmp_path)
    if fault == "hang":
        # a client timeout shorter than the hang; at most 4 connections at once, because a connect
        # beyond the test server's listen backlog (5) could itself time out and cost a retry
        overrides += ["optimizer.timeout_s=0.5", "reflect.workers=4"]
    outcomes = run_stage(tmp_path, server, dataset, *overrides)
    assert_all_valid(tmp_path / "run", outcomes)
    assert server.count == 2 * N_MINIBATCHES
    grouped = requests_by_minibatch(server)
    assert len(grouped) == N_MINIBATCHES and all(len(r) == 2 for r in grouped.values())
    other = "reasks" if counter == "retries" else "retries"
    for o in outcomes:
        assert getattr(o, counter) == 1 and getattr(o, other) == 0, o
        assert o.failed_calls == 0 and o.cache_hits == 0
        assert o.calls == (1 if counter == "retries" else 2)
    if fault == "truncated":
        for first, second in grouped.values():
            assert second["messages"] == first["messages"]  # asked again, not re-asked with an error
            assert second["max_completion_tokens"] == 2 * first["max_completion_tokens"]
    if fault == "garbage":
        for first, second in grouped.values():
            assert len(first["messages"]) == 2 and len(second["messages"]) == 4
            assert second["messages"][2]["role"] == "assistant"
    # an identical rerun costs zero requests: into the same run dir (resume) ...
    again = run_stage(tmp_path, server, dataset, *overrides)
    assert server.count == 2 * N_MINIBATCHES
    assert {o.status for o in again} == {"reused"}
    # ... and into a new run dir (the response cache)
    fresh = run_stage(tmp_path, server, dataset, *overrides, run_dir=tmp_path / "run2")
    assert server.count == 2 * N_MINIBATCHES
    assert_all_valid(tmp_path / "run2", fresh)
    assert all(o.cache_hits >= 1 and o.calls == 0 for o in fresh)
    for o in fresh:
        assert (tmp_path / "run2" / "patches" / f"{o.tag}.json").read_text() == (
            tmp_path / "run" / "patches" / f"{o.tag}.json").read_text()


def test_retry_after_zero_wins_over_a_long_backoff(tmp_path, server, dataset):
    """With a 5 s backoff configured, a 429 carrying Retry-After: 0 is retried at once."""
    script = FailFirst(FAULTS["429_retry_after_0"][0])
    server.script = script
    # 4 workers: no connect queues behind the test server's listen backlog (5) and adds to a gap
    outcomes = run_stage(tmp_path, server, dataset, "optimizer.retry.initial_wait_s=5",
                         "optimizer.retry.max_wait_s=5", "reflect.workers=4")
    assert_all_valid(tmp_path / "run", outcomes)
    assert server.count == 2 * N_MINIBATCHES
    gaps = [later - first for first, later in script.arrivals.values()]
    assert max(gaps) < 2.5  # the backoff alone would wait 5 s


def test_retry_after_ms_is_honoured(tmp_path, server, dataset):
    script = FailFirst(lambda r: Response(429, error_body("slow down"), {"retry-after-ms": "50"}))
    server.script = script
    # a first backoff of at most 2 ms (initial wait plus jitter): only the header can make the wait
    # reach 40 ms; max_wait_s (which caps a hint too) leaves it room
    outcomes = run_stage(tmp_path, server, dataset, "optimizer.retry.initial_wait_s=0.001",
                         "optimizer.retry.max_wait_s=1")
    assert_all_valid(tmp_path / "run", outcomes)
    assert server.count == 2 * N_MINIBATCHES
    assert all(o.retries == 1 for o in outcomes)
    gaps = [later - first for first, later in script.arrivals.values()]
    assert len(gaps) == N_MINIBATCHES and min(gaps) >= 0.04


def test_garbage_http_body_on_first_attempt_is_retried(tmp_path, server, dataset):
    server.script = FailFirst(lambda r: Response(200, "<html><body>502 Bad Gateway</body></html>"))
    outcomes = run_stage(tmp_path, server, dataset)
    assert_all_valid(tmp_path / "run", outcomes)
    assert server.count == 2 * N_MINIBATCHES


def test_retry_after_header_forms():
    def exc(headers):
        return SimpleNamespace(response=SimpleNamespace(headers=httpx.Headers(headers)))

    assert retry_after_s(exc({"retry-after-ms": "250"})) == pytest.approx(0.25)
    assert retry_after_s(exc({"Retry-After": "3"})) == 3.0
    assert retry_after_s(exc({"Retry-After": "0"})) == 0.0
    assert retry_after_s(exc({"retry-after-ms": "20", "retry-after": "9"})) == pytest.approx(0.02)
    date = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= retry_after_s(exc({"Retry-After": date})) <= 31
    past = email.utils.formatdate(time.time() - 30, usegmt=True)
    assert retry_after_s(exc({"Retry-After": past})) == 0.0
    assert retry_after_s(exc({"Retry-After": "soon"})) is None
    # not finite or not a number: no hint (the backoff applies); negative: no wait
    for garbage in ("nan", "NaN", "inf", "-inf", "1e999", "1,5", "0x10", "Wed, 21 Oct 99999 07:28:00 GMT"):
        assert retry_after_s(exc({"Retry-After": garbage})) is None, garbage
        assert retry_after_s(exc({"retry-after-ms": garbage})) is None, garbage
    assert retry_after_s(exc({"retry-after-ms": "nan", "retry-after": "2"})) == 2.0
    assert retry_after_s(exc({"Retry-After": "-5"})) == 0.0 and retry_after_s(exc({"retry-after-ms": "-1"})) == 0.0
    assert retry_after_s(exc({})) is None
    assert retry_after_s(ValueError("no response")) is None
    assert retry_after_s(None) is None


@pytest.mark.parametrize("status,transient", [
    (400, False), (401, False), (403, False), (404, False), (422, False),
    (408, True), (409, True), (429, True), (500, True), (502, True), (503, True), (504, True),
])
def test_which_http_statuses_are_transient(status, transient):
    request = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")
    error = openai.APIStatusError("x", response=httpx.Response(status, request=request), body=None)
    assert is_transient(error) is transient
    assert is_transient(openai.APITimeoutError(request=request))
    assert is_transient(openai.APIConnectionError(request=request))
    assert not is_transient(ValueError("not an API error"))


# 2. structured output ----------------------------------------------------------------------------


def reject_schema(request: dict, number: int) -> Response | None:
    if (request.get("response_format") or {}).get("type") == "json_schema":
        return Response(400, {"error": {"message": "response_format json_schema is not supported",
                                        "type": "invalid_request_error", "code": None}})
    return None


def test_auto_structured_output_drops_a_rejected_schema_for_the_rest_of_the_run(tmp_path, server, dataset):
    server.script = reject_schema
    outcomes = run_stage(tmp_path, server, dataset, "optimizer.structured_output=auto", "reflect.workers=1")
    assert_all_valid(tmp_path / "run", outcomes)
    first, repeated, *later = server.requests
    assert first["response_format"]["type"] == "json_schema"
    assert "response_format" not in repeated and repeated["messages"] == first["messages"]
    assert len(later) == N_MINIBATCHES - 1
    assert all("response_format" not in r for r in later)  # remembered for the run
    assert server.count == N_MINIBATCHES + 1
    assert [o.retries for o in outcomes] == [1] + [0] * (N_MINIBATCHES - 1)
    assert all(o.call_log[-1]["structured"] == "off" for o in outcomes)
    # a new run (a new client) tries the schema again
    run_stage(tmp_path, server, dataset, "optimizer.structured_output=auto", "reflect.workers=1",
              run_dir=tmp_path / "run2")
    assert server.requests[N_MINIBATCHES + 1]["response_format"]["type"] == "json_schema"


def test_auto_structured_output_with_concurrent_workers_still_completes(tmp_path, server, dataset):
    server.script = reject_schema
    outcomes = run_stage(tmp_path, server, dataset, "optimizer.structured_output=auto")
    assert_all_valid(tmp_path / "run", outcomes)
    rejected = sum(1 for r in server.requests if "response_format" in r)
    assert 1 <= rejected <= N_MINIBATCHES
    assert server.count == N_MINIBATCHES + rejected


def test_json_schema_setting_fails_the_minibatch_on_400(tmp_path, server, dataset):
    server.script = reject_schema
    outcomes = run_stage(tmp_path, server, dataset, "optimizer.structured_output=json_schema")
    assert server.count == N_MINIBATCHES  # neither retried nor repeated without the schema
    assert all(r["response_format"]["type"] == "json_schema" for r in server.requests)
    for o in outcomes:
        assert o.status == "failed" and o.error.startswith("HTTP 400"), o.error
        assert o.retries == 0 and o.failed_calls == 1
        assert not (tmp_path / "run" / "patches" / f"{o.tag}.json").exists()


def test_structured_output_settings_shape_the_request(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=4, n_succ=4)
    for n, setting in enumerate(["auto", "json_schema", "json_object", "off"]):
        run_stage(tmp_path, server, data, f"optimizer.structured_output={setting}", run_dir=tmp_path / f"run{n}")
    auto, schema, json_object, off = (server.requests[i:i + 2] for i in range(0, 8, 2))
    for request in auto + schema:
        fmt = request["response_format"]
        assert fmt["type"] == "json_schema"
        assert fmt["json_schema"]["schema"]["type"] == "object"
        assert "patch" in fmt["json_schema"]["schema"]["properties"]
    assert all(r["response_format"] == {"type": "json_object"} for r in json_object)
    assert all("response_format" not in r for r in off)


# 3. a minibatch whose calls always fail ----------------------------------------------------------


def test_always_failing_minibatch_is_recorded_and_redone_alone(tmp_path, server, dataset):
    cfg = config(tmp_path, server, dataset)
    plan = plan_minibatches(load_dataset(cfg.data).results, cfg.reflect)
    doomed = plan[2]
    doomed_ids = {r.id for r in doomed.results}

    def script(request, number):
        if set(IDS.findall(conversation_key(request))) == doomed_ids:
            return Response(500, error_body("always broken"))
        return None

    server.script = script
    outcomes = run_stage(tmp_path, server, dataset, "optimizer.retry.max_attempts=3")
    by_tag = {o.tag: o for o in outcomes}
    bad = by_tag[doomed.tag]
    assert bad.status == "failed" and bad.error.startswith("HTTP 500"), bad.error
    assert bad.retries == 2 and bad.failed_calls == 1 and bad.calls == 0
    assert not (tmp_path / "run" / "patches" / f"{doomed.tag}.json").exists()
    saved = json.loads((tmp_path / "run" / "calls" / doomed.tag / "outcome.json").read_text())
    assert saved["status"] == "failed" and saved["error"].startswith("HTTP 500")
    grouped = requests_by_minibatch(server)
    assert sorted(len(r) for r in grouped.values()) == [1] * (N_MINIBATCHES - 1) + [3]
    assert server.count == N_MINIBATCHES + 2
    assert all(o.status == "done" for o in outcomes if o is not bad)
    # the same run dir with a healthy server: only the failed minibatch is redone
    server.script = None
    again = run_stage(tmp_path, server, dataset, "optimizer.retry.max_attempts=3")
    assert server.count == N_MINIBATCHES + 3
    assert {o.tag: o.status for o in again} == {o.tag: ("done" if o.tag == doomed.tag else "reused")
                                               for o in outcomes}
    assert IDS.findall(conversation_key(server.requests[-1])) == [r.id for r in doomed.results]


def test_a_hang_on_every_attempt_is_bounded(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=4, n_succ=0)
    server.script = lambda r, n: Response(body=chat_body(valid_text(r)), delay_s=2.0)
    [o] = run_stage(tmp_path, server, data, "optimizer.timeout_s=0.3", "optimizer.retry.max_attempts=2")
    assert o.status == "failed" and o.error == "timed out" and o.retries == 1
    assert server.count == 2


def test_an_unreachable_server_fails_every_minibatch_at_once(tmp_path, server):
    """Never reached: no retry (tests/test_endpoint.py has the run's one line)."""
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    data = write_dataset(tmp_path / "d", n_fail=8, n_succ=0)
    cfg = config(tmp_path, server, data, f"optimizer.base_url=http://127.0.0.1:{port}/v1",
                 "optimizer.retry.max_attempts=2")
    outcomes = Stage(stage_settings(cfg), load_dataset(cfg.data), make_client(cfg.optimizer, tmp_path, environ={}),
                     tmp_path / "run").run()
    assert len(outcomes) == 2
    for o in outcomes:
        assert o.status == "failed" and o.error.startswith("connection failed"), o.error
        assert o.retries == 0 and o.failed_calls == 1


# 4. non-transient errors -------------------------------------------------------------------------


@pytest.mark.parametrize("status", [400, 422])  # 401, 403, 404 before any reply: tests/test_endpoint.py
def test_non_transient_errors_are_not_retried(tmp_path, server, status):
    data = write_dataset(tmp_path / "d", n_fail=8, n_succ=4)
    server.script = lambda r, n: Response(status, {"error": {"message": f"status {status}", "type": "x"}})
    outcomes = run_stage(tmp_path, server, data, "optimizer.structured_output=off")
    assert server.count == len(outcomes) == 3
    assert len(requests_by_minibatch(server)) == 3  # exactly one request per minibatch
    for o in outcomes:
        assert o.status == "failed" and o.error.startswith(f"HTTP {status}"), o.error
        assert o.retries == 0 and o.reasks == 0


# 5. the response cache ---------------------------------------------------------------------------


@pytest.fixture
def small(tmp_path):
    """3 minibatches."""
    return write_dataset(tmp_path / "small", n_fail=8, n_succ=4)


def test_cache_answers_a_rerun_in_a_new_run_dir(tmp_path, server, small):
    first = run_stage(tmp_path, server, small, *with_cache(tmp_path), run_dir=tmp_path / "r1")
    assert server.count == 3 and all(o.calls == 1 and o.cache_hits == 0 for o in first)
    second = run_stage(tmp_path, server, small, *with_cache(tmp_path), run_dir=tmp_path / "r2")
    assert server.count == 3
    assert all(o.status == "done" and o.cache_hits == 1 and o.calls == 0 for o in second)
    assert all(o.spent_usd == 0 for o in second)  # a hit costs nothing now
    for o in second:
        assert (tmp_path / "r2" / "patches" / f"{o.tag}.json").read_text() == (
            tmp_path / "r1" / "patches" / f"{o.tag}.json").read_text()
    # cache=off asks again
    run_stage(tmp_path, server, small, "optimizer.cache=off", run_dir=tmp_path / "r3")
    assert server.count == 6


def test_cache_default_path_is_under_the_launch_dir(tmp_path, server, small):
    run_stage(tmp_path, server, small, "optimizer.cache=read_write", run_dir=tmp_path / "r1")
    assert (tmp_path / "outputs" / "cache.db").exists()
    run_stage(tmp_path, server, small, "optimizer.cache=read_write", run_dir=tmp_path / "r2")
    assert server.count == 3


def test_cache_read_never_writes(tmp_path, server, small):
    run_stage(tmp_path, server, small, *with_cache(tmp_path, "read"), run_dir=tmp_path / "r1")
    run_stage(tmp_path, server, small, *with_cache(tmp_path, "read"), run_dir=tmp_path / "r2")
    assert server.count == 6
    run_stage(tmp_path, server, small, *with_cache(tmp_path, "read_write"), run_dir=tmp_path / "r3")
    assert server.count == 9  # nothing was written before
    outcomes = run_stage(tmp_path, server, small, *with_cache(tmp_path, "read"), run_dir=tmp_path / "r4")
    assert server.count == 9 and all(o.cache_hits == 1 for o in outcomes)


def test_cache_write_never_reads(tmp_path, server, small):
    run_stage(tmp_path, server, small, *with_cache(tmp_path, "write"), run_dir=tmp_path / "r1")
    outcomes = run_stage(tmp_path, server, small, *with_cache(tmp_path, "write"), run_dir=tmp_path / "r2")
    assert server.count == 6 and all(o.cache_hits == 0 for o in outcomes)
    run_stage(tmp_path, server, small, *with_cache(tmp_path, "read"), run_dir=tmp_path / "r3")
    assert server.count == 6  # what `write` wrote is there to read


def test_sample_index_is_part_of_the_cache_key(tmp_path, server, small):
    run_stage(tmp_path, server, small, *with_cache(tmp_path), "optimizer.sample=0", run_dir=tmp_path / "r1")
    run_stage(tmp_path, server, small, *with_cache(tmp_path), "optimizer.sample=1", run_dir=tmp_path / "r2")
    assert server.count == 6
    run_stage(tmp_path, server, small, *with_cache(tmp_path), "optimizer.sample=0", run_dir=tmp_path / "r3")
    run_stage(tmp_path, server, small, *with_cache(tmp_path), "optimizer.sample=1", run_dir=tmp_path / "r4")
    assert server.count == 6
    run_stage(tmp_path, server, small, *with_cache(tmp_path), "optimizer.sample=2", run_dir=tmp_path / "r5")
    assert server.count == 9


def test_another_sample_in_the_same_run_dir_is_a_fresh_draw(tmp_path, server, small):
    run_stage(tmp_path, server, small, "optimizer.temperature=1.0", "optimizer.sample=0")
    run_stage(tmp_path, server, small, "optimizer.temperature=1.0", "optimizer.sample=1")
    assert server.count == 6


def test_other_settings_miss_the_cache(tmp_path, server, small):
    run_stage(tmp_path, server, small, *with_cache(tmp_path), run_dir=tmp_path / "r1")
    run_stage(tmp_path, server, small, *with_cache(tmp_path), "optimizer.temperature=0.5", run_dir=tmp_path / "r2")
    run_stage(tmp_path, server, small, *with_cache(tmp_path), "optimizer.structured_output=off",
              run_dir=tmp_path / "r3")
    run_stage(tmp_path, server, small, *with_cache(tmp_path), "optimizer.max_output_tokens=999",
              run_dir=tmp_path / "r4")
    assert server.count == 12


def test_a_finally_failed_minibatch_is_not_replayed_from_cache(tmp_path, server, small):
    bad = {"patch": {"reasoning": "x", "edits": [{"op": "replace", "content": "no target"}]}}
    server.script = lambda r, n: Response(body=chat_body(json.dumps(bad)))
    first = run_stage(tmp_path, server, small, *with_cache(tmp_path), "reflect.max_reasks=1", run_dir=tmp_path / "r1")
    assert server.count == 6 and all(o.status == "failed" and "target" in o.error for o in first)
    second = run_stage(tmp_path, server, small, *with_cache(tmp_path), "reflect.max_reasks=1",
                       run_dir=tmp_path / "r2")
    assert server.count == 12  # asked again, not replayed
    assert all(o.status == "failed" and o.cache_hits == 0 for o in second)
    server.script = None
    third = run_stage(tmp_path, server, small, *with_cache(tmp_path), "reflect.max_reasks=1",
                      run_dir=tmp_path / "r3")
    assert server.count == 15 and all(o.status == "done" and o.cache_hits == 0 for o in third)


def test_unusable_reply_before_a_failed_call_is_not_replayed(tmp_path, server, small):
    def script(request, number):
        if len(request["messages"]) == 2:
            return Response(body=chat_body("no json here"))
        return Response(500, error_body("down"))  # every re-ask fails

    server.script = script
    first = run_stage(tmp_path, server, small, *with_cache(tmp_path), "optimizer.retry.max_attempts=2",
                      run_dir=tmp_path / "r1")
    assert all(o.status == "failed" and o.error.startswith("HTTP 500") for o in first)
    server.script = None
    second = run_stage(tmp_path, server, small, *with_cache(tmp_path), run_dir=tmp_path / "r2")
    assert all(o.status == "done" for o in second)
    assert all(o.cache_hits == 0 and o.reasks == 0 for o in second)


# 6. the cost limit -------------------------------------------------------------------------------

# the server reports 100 prompt tokens (20 cached) and 50 completion tokens per call;
# model gpt-5 has a price in conf/optimizer/openai.yaml that an override can change
PRICED = ["optimizer.model=gpt-5"]


def test_cost_is_computed_from_the_price_table(tmp_path, server, small):
    outcomes = run_stage(tmp_path, server, small, *PRICED,
                         "optimizer.prices.gpt-5={input:1.0,cached_input:0.5,output:2.0}")
    for o in outcomes:
        assert (o.usage.prompt, o.usage.cached, o.usage.completion) == (100, 20, 50)
        assert o.cost_usd == pytest.approx((80 * 1.0 + 20 * 0.5 + 50 * 2.0) / 1e6)


# a call's worst case here: 100 output tokens at $10,000 per million = $1.00 (input is free); what
# the server's replies cost: 50 completion tokens = $0.50
CAPPED = ["optimizer.prices.gpt-5={input:0,cached_input:0,output:10000}", "optimizer.max_output_tokens=100"]


@pytest.mark.parametrize("workers", [1, 8])
def test_spend_never_passes_the_cap_whatever_the_number_of_workers(tmp_path, server, dataset, workers):
    outcomes = run_stage(tmp_path, server, dataset, *PRICED, *CAPPED, "optimizer.max_cost_usd=2.2",
                         f"reflect.workers={workers}")
    # a call starts only when its worst case fits beside what was spent and is in flight: after
    # three calls ($1.50 spent) a fourth could reach $2.50
    assert server.count == 3
    assert sum(o.spent_usd for o in outcomes) == pytest.approx(1.5)
    assert sorted(o.status for o in outcomes).count("done") == 3
    assert {o.status for o in outcomes} == {"done", "not_run"}
    assert all(not (tmp_path / "run" / "patches" / f"{o.tag}.json").exists() for o in outcomes if o.status == "not_run")
    # a rerun with room to spend does only what was not run
    again = run_stage(tmp_path, server, dataset, *PRICED, *CAPPED, "optimizer.max_cost_usd=100", "reflect.workers=1")
    assert server.count == N_MINIBATCHES
    assert sorted(o.status for o in again) == ["done"] * (N_MINIBATCHES - 3) + ["reused"] * 3


def test_a_call_whose_worst_case_does_not_fit_is_not_made(tmp_path, server, small):
    outcomes = run_stage(tmp_path, server, small, *PRICED, *CAPPED, "optimizer.max_cost_usd=0.99")
    assert server.count == 0 and {o.status for o in outcomes} == {"not_run"}


def test_cost_limit_zero_makes_no_call(tmp_path, server, small):
    outcomes = run_stage(tmp_path, server, small, *PRICED, "optimizer.max_cost_usd=0")
    assert server.count == 0 and {o.status for o in outcomes} == {"not_run"}


def test_cost_limit_also_stops_a_reask(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=4, n_succ=0)
    server.script = FailFirst(FAULTS["garbage"][0])
    [o] = run_stage(tmp_path, server, data, *PRICED, *CAPPED, "optimizer.max_cost_usd=1.2")
    assert server.count == 1 and o.status == "not_run"  # the re-ask's worst case would pass the cap


def test_a_capped_model_without_a_price_is_refused(tmp_path):
    with pytest.raises(UserError, match="optimizer.max_cost_usd.*no price"):
        make_config(f"data.dir={tmp_path}", "optimizer.model=unpriced", "optimizer.max_cost_usd=5")


def test_a_price_for_a_new_model_can_be_given_on_the_command_line(tmp_path):
    cfg = make_config(f"data.dir={tmp_path}", "optimizer.model=test",
                      "+optimizer.prices.test={input:1000000,cached_input:0,output:0}")
    assert cfg.optimizer.prices["test"].input == 1000000


# 7. the rate limiter -----------------------------------------------------------------------------


class FakeClock:
    """Stands in for the `time` module inside reflact.calls.ratelimit: sleeping advances the clock."""

    def __init__(self) -> None:
        self.now = 1000.0
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        with self._lock:
            return self.now

    def sleep(self, seconds: float) -> None:
        assert 0 < seconds <= 1.0  # the limiter sleeps in short steps
        with self._lock:
            # a real sleep always lets the clock move on; a float sum might not for a tiny step
            self.now += max(seconds, 1e-6)

    def elapsed(self) -> float:
        return self.monotonic() - 1000.0


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(ratelimit, "time", fake)
    return fake


def test_bucket_starts_full_and_refills_at_the_per_minute_rate(clock):
    bucket = Bucket(60)
    assert [bucket.wait_for(1) for _ in range(60)] == [0.0] * 60
    assert bucket.wait_for(1) == pytest.approx(1.0)
    clock.now += 0.5
    assert bucket.wait_for(1) == pytest.approx(0.5)
    clock.now += 0.5
    assert bucket.wait_for(1) == 0.0
    clock.now += 3600
    assert bucket.level == pytest.approx(0.0) and bucket.wait_for(0) == 0.0
    assert bucket.level == pytest.approx(60.0)  # never above capacity
    assert Bucket(100).wait_for(500) == 0.0  # larger than a minute's allowance: goes alone when full


def test_rate_limiter_paces_requests(clock):
    limiter = RateLimiter(rpm=6, tpm=None)
    times = []
    for _ in range(9):
        limiter.acquire(10_000)
        times.append(clock.elapsed())
    assert times[:6] == [0.0] * 6  # the bucket starts full
    assert times[6:] == pytest.approx([10.0, 20.0, 30.0])


def test_rate_limiter_paces_tokens_and_gives_back_the_request_slot(clock):
    limiter = RateLimiter(rpm=2, tpm=100)
    times = []
    for tokens in (100, 100, 0):
        limiter.acquire(tokens)
        times.append(clock.elapsed())
    # the second request waits a minute for tokens; the slots it held while waiting were given
    # back, so the third (no tokens) goes at once
    assert times == pytest.approx([0.0, 60.0, 60.0])


def test_rate_limiter_shared_by_threads(clock):
    limiter = RateLimiter(rpm=3, tpm=None)
    times = []
    lock = threading.Lock()

    def worker():
        limiter.acquire(1)
        with lock:
            times.append(clock.elapsed())

    threads = [threading.Thread(target=worker) for _ in range(7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    times.sort()
    assert len(times) == 7
    for i, at in enumerate(times):  # capacity 3, then one per 20 s of the (fake) clock
        assert at >= 20.0 * (i - 2) - 1e-6


def test_stage_requests_respect_rpm(tmp_path, server, clock):
    data = write_dataset(tmp_path / "d", n_fail=12, n_succ=4)  # 4 minibatches
    arrivals = []
    lock = threading.Lock()

    def script(request, number):
        with lock:
            arrivals.append(clock.elapsed())
        return None

    server.script = script
    # one worker: while its request is in flight nothing else moves the fake clock
    outcomes = run_stage(tmp_path, server, data, "optimizer.rpm=2", "reflect.workers=1")
    assert {o.status for o in outcomes} == {"done"}
    assert arrivals == pytest.approx([0.0, 0.0, 30.0, 60.0], abs=1e-3)  # 2 at once, then one per 30 s


def test_stage_workers_share_the_rate_limit(tmp_path, server, clock, monkeypatch):
    data = write_dataset(tmp_path / "d", n_fail=16, n_succ=8)  # 6 minibatches
    released = []
    lock = threading.Lock()
    acquire = RateLimiter.acquire

    def recording_acquire(self, tokens):
        acquire(self, tokens)
        with lock:
            released.append(clock.elapsed())

    monkeypatch.setattr(RateLimiter, "acquire", recording_acquire)
    outcomes = run_stage(tmp_path, server, data, "optimizer.rpm=2", "reflect.workers=6")
    assert {o.status for o in outcomes} == {"done"} and server.count == len(released) == 6
    # whatever the order, never more than the 2 a full bucket holds plus one per 30 s (fake clock)
    for i, at in enumerate(sorted(released)):
        assert at >= 30.0 * (i - 1) - 1e-3


def test_retries_count_against_rpm(tmp_path, server, clock):
    data = write_dataset(tmp_path / "d", n_fail=8, n_succ=0)  # 2 minibatches
    arrivals = []
    fail_first = FailFirst(FAULTS["500"][0])

    def script(request, number):
        arrivals.append(clock.elapsed())
        return fail_first(request, number)

    server.script = script
    outcomes = run_stage(tmp_path, server, data, "optimizer.rpm=2", "reflect.workers=1")
    assert {o.status for o in outcomes} == {"done"} and len(arrivals) == 4
    assert sum(1 for at in arrivals if at < 30.0) <= 2  # 2 requests per minute, retries included


def test_schema_fallback_request_counts_against_rpm(tmp_path, server, clock):
    data = write_dataset(tmp_path / "d", n_fail=4, n_succ=0)
    arrivals = []

    def script(request, number):
        arrivals.append(clock.elapsed())
        return reject_schema(request, number)

    server.script = script
    [o] = run_stage(tmp_path, server, data, "optimizer.rpm=1", "optimizer.structured_output=auto")
    assert o.status == "done" and len(arrivals) == 2
    assert arrivals[1] >= 60.0 - 1e-3  # 1 request per minute, the repeat included


# 8. the dry run ----------------------------------------------------------------------------------


def test_dry_run_calls_nothing_and_estimates_cost(tmp_path, server, dataset):
    cfg = config(tmp_path, server, dataset, *PRICED)
    stage = Stage(stage_settings(cfg), load_dataset(cfg.data), DryRunEstimator(1500), tmp_path / "run")
    outcomes = stage.run()
    assert server.count == 0
    assert len(outcomes) == N_MINIBATCHES
    for o in outcomes:
        assert o.status == "dry_run" and o.calls == 0
        assert o.usage.prompt > 0 and o.usage.completion > 0 and o.cost_usd > 0
        assert (tmp_path / "run" / "calls" / o.tag / "user.md").exists()
        assert not (tmp_path / "run" / "patches" / f"{o.tag}.json").exists()
    # no price for the model: tokens still estimated, cost 0
    cfg = config(tmp_path, server, dataset)
    [unpriced, *_] = Stage(stage_settings(cfg), load_dataset(cfg.data), DryRunEstimator(1500), tmp_path / "run2").run()
    assert unpriced.status == "dry_run" and unpriced.usage.prompt > 0 and unpriced.cost_usd == 0


def test_dry_run_experiment_logs_a_cost_estimate(tmp_path, server, dataset, caplog):
    cfg = config(tmp_path, server, dataset, *PRICED, "optimizer.dry_run=true", "mlflow.enabled=false")
    with caplog.at_level(logging.INFO, logger="reflact"):
        summary = run_experiment(config_parts(cfg), {}, tmp_path / "run", Launch(tmp_path)).summary
    assert server.count == 0
    assert summary["counts"]["minibatches_dry_run"] == N_MINIBATCHES and summary["counts"]["calls"] == 0
    assert summary["counts"]["cost_usd"] > 0
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("dry run:")]
    assert f"{N_MINIBATCHES} prompts built" in line
    assert re.search(r"estimated \$\d+\.\d{4} for gpt-5", line)
    assert f"${summary['counts']['cost_usd']:.4f}" in line



# 9. a hostile or broken server: malformed bodies, Retry-After, trickling, the cache key, close ---

MESSAGES = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
DROP = object()  # altered(): remove the key


def client_for(tmp_path, server, *overrides, environ=None):
    """A client of the loopback server with tiny retry waits and no cache (unless overridden)."""
    cfg = make_config(f"data.dir={tmp_path}", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
                      "optimizer.retry.initial_wait_s=0.01", "optimizer.retry.max_wait_s=0.05", "optimizer.cache=off",
                      *overrides)
    return make_client(cfg.optimizer, tmp_path, environ=environ or {})


def altered(*path_and_value) -> dict:
    """chat_body("hello") with the value at one path (keys and indexes) replaced, or DROPped."""
    *path, value = path_and_value
    body = chat_body("hello")
    parent = body
    for step in path[:-1]:
        parent = parent[step]
    if value is DROP:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return body


MALFORMED = {
    # name: (the body of a 200, what the call's cause starts with after "malformed reply: ")
    "html_proxy_page": ("<html><body>502 Bad Gateway</body></html>",
                        "the body is not JSON ('<html><body>502 Bad Gateway</body></html>')"),
    "empty_body": ("", "the body is empty"),
    "not_utf8": (b'{"choices": "\xff\xfe"}', "the body is not JSON"),
    "nested_beyond_the_parser": ("[" * 100_000 + "]" * 100_000, "the body is not JSON"),
    "json_list": ("[1, 2]", "the body is a list, not an object"),
    "json_string": ('"fine"', "the body is a string, not an object"),
    "json_null": ("null", "the body is null, not an object"),
    "error_object": ({"error": {"message": "upstream timed out"}}, "no choices; the server said: upstream timed out"),
    "choices_missing": (altered("choices", DROP), "no choices"),
    "choices_null": (altered("choices", None), "choices is null"),
    "choices_string": (altered("choices", "hello"), "choices is a string"),
    "choices_object": (altered("choices", {"0": {}}), "choices is an object"),
    "choices_empty": (altered("choices", []), "choices is empty"),
    "choice_string": (altered("choices", 0, "hello"), "choices[0] is a string"),
    "message_missing": (altered("choices", 0, "message", DROP), "choices[0] has no message"),
    "message_null": (altered("choices", 0, "message", None), "choices[0].message is null"),
    "message_string": (altered("choices", 0, "message", "hello"), "choices[0].message is a string"),
    "message_list": (altered("choices", 0, "message", ["hello"]), "choices[0].message is a list"),
    "content_list": (altered("choices", 0, "message", "content", ["hello"]), "choices[0].message.content is a list"),
    "content_object": (altered("choices", 0, "message", "content", {"text": "hello"}),
                       "choices[0].message.content is an object"),
    "content_number": (altered("choices", 0, "message", "content", 42), "choices[0].message.content is a number"),
    "content_boolean": (altered("choices", 0, "message", "content", True), "choices[0].message.content is a boolean"),
    "finish_reason_list": (altered("choices", 0, "finish_reason", ["stop"]), "choices[0].finish_reason is a list"),
    "finish_reason_number": (altered("choices", 0, "finish_reason", 1), "choices[0].finish_reason is a number"),
    "finish_reason_object": (altered("choices", 0, "finish_reason", {}), "choices[0].finish_reason is an object"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_reply_is_retried_then_fails_the_call_naming_what_was_wrong(tmp_path, server, case):
    body, cause = MALFORMED[case]
    server.script = lambda r, n: Response(body=body)
    with closing(client_for(tmp_path, server, "optimizer.retry.max_attempts=2")) as client:
        with pytest.raises(CallError) as failed:
            client.complete(MESSAGES, 10)
        assert failed.value.cause.startswith(f"malformed reply: {cause}"), failed.value.cause
        assert "\n" not in failed.value.cause and len(failed.value.cause) <= 300
        assert failed.value.retries == 1 and server.count == 2
        # a torn reply followed by a good one: the retry gets the good one
        server.script = lambda r, n: Response(body=body) if n == 3 else Response(body=chat_body("fine"))
        reply = client.complete(MESSAGES, 10)
        assert reply.text == "fine" and reply.retries == 1 and server.count == 4


@pytest.mark.parametrize("content", [None, "", DROP], ids=["null", "empty", "missing"])
def test_valid_but_empty_content_is_a_reply_not_a_failure(tmp_path, server, content):
    server.script = lambda r, n: Response(body=altered("choices", 0, "message", "content", content))
    with closing(client_for(tmp_path, server)) as client:
        reply = client.complete(MESSAGES, 10)
    assert (reply.text, reply.finish_reason, reply.retries, server.count) == ("", "stop", 0, 1)


def test_the_stage_records_malformed_replies_as_failed_minibatches(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=8, n_succ=4)  # 3 minibatches
    server.script = lambda r, n: Response(body="[]")
    outcomes = run_stage(tmp_path, server, data, "optimizer.retry.max_attempts=2")
    assert len(outcomes) == 3 and server.count == 6
    for o in outcomes:
        assert o.status == "failed" and o.error == "malformed reply: the body is a list, not an object", o.error
        assert o.retries == 1 and o.failed_calls == 1


def test_a_lone_surrogate_in_a_reply_is_saved_as_a_replacement_character(tmp_path, server):
    """JSON can carry "\\ud800", which no UTF-8 file can hold: the reply and patch are still saved."""
    data = write_dataset(tmp_path / "d", n_fail=4, n_succ=0)
    server.script = lambda r, n: Response(body=chat_body(valid_text(r).replace("rule 0", "rule \ud800 0")))
    [o] = run_stage(tmp_path, server, data)
    assert o.status == "done", o.error
    patch = json.loads((tmp_path / "run" / "patches" / f"{o.tag}.json").read_text(encoding="utf-8"))
    assert patch["patch"]["edits"][0]["content"].startswith("- rule \ufffd 0")


USAGE = {
    # name: (the reply's body, the usage read, the field warned about or None)
    "missing": (altered("usage", DROP), Usage(), None),
    "null": (altered("usage", None), Usage(), None),
    "string": (altered("usage", "lots"), Usage(), "usage"),
    "list": (altered("usage", [100, 50]), Usage(), "usage"),
    "prompt_tokens_null": (altered("usage", "prompt_tokens", None), Usage(0, 20, 50, 10), None),
    "prompt_tokens_string": (altered("usage", "prompt_tokens", "100"), Usage(0, 20, 50, 10), "usage.prompt_tokens"),
    "prompt_tokens_negative": (altered("usage", "prompt_tokens", -5), Usage(0, 20, 50, 10), "usage.prompt_tokens"),
    "prompt_tokens_fractional": (altered("usage", "prompt_tokens", 10.5), Usage(0, 20, 50, 10), "usage.prompt_tokens"),
    "prompt_tokens_boolean": (altered("usage", "prompt_tokens", True), Usage(0, 20, 50, 10), "usage.prompt_tokens"),
    "prompt_tokens_huge": (altered("usage", "prompt_tokens", 10**30), Usage(0, 20, 50, 10), "usage.prompt_tokens"),
    "prompt_tokens_5000_digits": (json.dumps(chat_body("hello")).replace('"prompt_tokens": 100', '"prompt_tokens": '
                                                                         + "9" * 5000),
                                  Usage(0, 20, 50, 10), "usage.prompt_tokens"),
    "prompt_tokens_infinite": (json.dumps(chat_body("hello")).replace('"prompt_tokens": 100', '"prompt_tokens": 1e999'),
                               Usage(0, 20, 50, 10), "usage.prompt_tokens"),
    "prompt_tokens_nan": (json.dumps(chat_body("hello")).replace('"prompt_tokens": 100', '"prompt_tokens": NaN'),
                          Usage(0, 20, 50, 10), "usage.prompt_tokens"),
    "prompt_tokens_whole_float": (altered("usage", "prompt_tokens", 100.0), Usage(100, 20, 50, 10), None),
    "completion_tokens_list": (altered("usage", "completion_tokens", [50]), Usage(100, 20, 0, 10),
                               "usage.completion_tokens"),
    "prompt_details_string": (altered("usage", "prompt_tokens_details", "x"), Usage(100, 0, 50, 10),
                              "usage.prompt_tokens_details"),
    "prompt_details_null": (altered("usage", "prompt_tokens_details", None), Usage(100, 0, 50, 10), None),
    "cached_tokens_string": (altered("usage", "prompt_tokens_details", "cached_tokens", "20"), Usage(100, 0, 50, 10),
                             "usage.prompt_tokens_details.cached_tokens"),
    "cached_more_than_prompt": (altered("usage", "prompt_tokens_details", "cached_tokens", 150),
                                Usage(100, 100, 50, 10), "usage.prompt_tokens_details.cached_tokens"),
    "completion_details_list": (altered("usage", "completion_tokens_details", [10]), Usage(100, 20, 50, 0),
                                "usage.completion_tokens_details"),
    "reasoning_tokens_negative": (altered("usage", "completion_tokens_details", "reasoning_tokens", -1),
                                  Usage(100, 20, 50, 0), "usage.completion_tokens_details.reasoning_tokens"),
}


@pytest.mark.parametrize("case", list(USAGE))
def test_unreadable_token_counts_count_as_zero_with_one_warning(tmp_path, server, case, caplog):
    """Usage only feeds token and cost totals: a reply is kept for it, the field named once."""
    body, usage, warned = USAGE[case]
    server.script = lambda r, n: Response(body=body)
    with closing(client_for(tmp_path, server)) as client, caplog.at_level(logging.WARNING, logger="reflact"):
        replies = [client.complete(MESSAGES, 10), client.complete(MESSAGES, 10)]
    assert server.count == 2 and all(r.text == "hello" and r.retries == 0 and r.usage == usage for r in replies)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    if warned is None:
        assert not warnings
    else:  # once per field and client, not once per reply
        assert len(warnings) == 1 and warnings[0].startswith(f"the optimizer's reply: {warned} is "), warnings


BAD_RETRY_AFTER = ["nan", "NaN", "inf", "-inf", "1e999", "1e10", "Wed, 21 Oct 2099 07:28:00 GMT", "-5", "soon", ""]


@pytest.mark.parametrize("value", BAD_RETRY_AFTER)
@pytest.mark.parametrize("header", ["Retry-After", "retry-after-ms"])
def test_a_429_with_any_retry_after_is_retried_within_max_wait(tmp_path, server, header, value):
    server.script = lambda r, n: Response(429, error_body("slow down"), {header: value}) if n == 1 else None
    # the hints that parse (1e10, a date in 2099) wait max_wait_s: 0.05 s
    with closing(client_for(tmp_path, server, "optimizer.retry.max_attempts=2")) as client:
        reply = client.complete(MESSAGES, 10)
    assert reply.retries == 1 and server.count == 2


def test_a_retry_after_hint_is_capped_by_max_wait_and_an_unreadable_one_falls_back_to_backoff():
    wait = wait_after(0.01, 0.5)

    def waited(headers: dict) -> float:
        exc = SimpleNamespace(response=SimpleNamespace(headers=httpx.Headers(headers)))
        return wait(SimpleNamespace(outcome=SimpleNamespace(exception=lambda: exc), attempt_number=1))

    assert waited({"Retry-After": "0.2"}) == pytest.approx(0.2)
    for hint in ("3", "1e10", "Wed, 21 Oct 2099 07:28:00 GMT"):
        assert waited({"Retry-After": hint}) == 0.5
    assert waited({"retry-after-ms": "1e12"}) == 0.5
    assert waited({"Retry-After": "-5"}) == 0.0 and waited({"retry-after-ms": "-100"}) == 0.0
    for garbage in ("nan", "inf", "-inf", "soon", "1e999"):
        assert 0.01 <= waited({"Retry-After": garbage}) <= 0.02  # the backoff's first wait: 0.01 plus jitter


@pytest.mark.parametrize("headers_too", [False, True], ids=["body", "headers_and_body"])
def test_timeout_bounds_the_whole_request_against_a_trickling_server(tmp_path, server, headers_too):
    """A server that sends a byte every 0.1 s never lets a single read time out."""
    body = chat_body("x" * 40)
    trickle = len(json.dumps(body)) * 0.1  # over 40 s to send it all
    server.script = lambda r, n: Response(body=body, trickle_s=0.1, trickle_headers=headers_too)
    with closing(client_for(tmp_path, server, "optimizer.timeout_s=1", "optimizer.retry.max_attempts=1")) as client:
        started = time.monotonic()
        with pytest.raises(CallError) as failed:
            client.complete(MESSAGES, 10)
        took = time.monotonic() - started
    assert failed.value.cause == "timed out" and server.count == 1
    assert took < trickle / 2  # a bound on the behaviour (the deadline holds), not a benchmark


SCHEMA = {"type": "object", "properties": {"patch": {"type": "object"}}}
KEY_BASE = {"server": "a", "provider": "openai", "deployment": "dep-a", "api_version": "2024-10-21", "model": "test",
            "messages": MESSAGES, "allowance": 10, "token_limit_param": "max_completion_tokens", "temperature": 0.0,
            "reasoning_effort": "high", "structured_output": "json_schema", "schema": SCHEMA, "sample": 0}
AZURE = {"provider": "azure"}
KEY_FIELDS = {
    # field: (the base request's changes to KEY_BASE, the one change that must miss the cache)
    "base_url": ({}, {"server": "b"}),
    "model": ({}, {"model": "test-2"}),
    "messages": ({}, {"messages": [MESSAGES[0], {"role": "user", "content": "u2"}]}),
    "max_output_tokens": ({}, {"allowance": 11}),
    "token_limit_param": ({}, {"token_limit_param": "max_tokens"}),
    "temperature": ({}, {"temperature": 0.5}),
    "reasoning_effort": ({}, {"reasoning_effort": "low"}),
    "structured_output": ({}, {"structured_output": "json_object"}),
    "schema": ({}, {"schema": {**SCHEMA, "required": ["patch"]}}),
    "sample": ({}, {"sample": 1}),
    "azure_endpoint": (AZURE, {"server": "b"}),
    "azure_deployment": (AZURE, {"deployment": "dep-b"}),
    "azure_api_version": (AZURE, {"api_version": "2025-01-01-preview"}),
}


def cached_ask(tmp_path, servers, **changes):
    """One request through a new client on a shared response cache."""
    s = {**KEY_BASE, **changes}
    overrides = [f"optimizer.model={s['model']}", f"optimizer.token_limit_param={s['token_limit_param']}",
                 f"optimizer.temperature={s['temperature']}", f"optimizer.reasoning_effort={s['reasoning_effort']}",
                 f"optimizer.structured_output={s['structured_output']}", f"optimizer.sample={s['sample']}",
                 *with_cache(tmp_path)]
    server = servers[s["server"]]
    if s["provider"] == "azure":
        overrides += ["optimizer=azure", "optimizer.base_url=null",
                      f"optimizer.azure.endpoint={server.base_url.removesuffix('/v1')}",
                      f"optimizer.azure.deployment={s['deployment']}",
                      f"optimizer.azure.api_version={s['api_version']}"]
    with closing(client_for(tmp_path, server, *overrides, environ={"AZURE_OPENAI_API_KEY": "k"})) as client:
        return client.complete(s["messages"], s["allowance"], s["schema"])


@pytest.mark.parametrize("field", list(KEY_FIELDS))
def test_every_field_of_the_cache_key_matters(tmp_path, server, field):
    base, change = KEY_FIELDS[field]
    with OptimizerServer() as other:
        servers = {"a": server, "b": other}
        assert not cached_ask(tmp_path, servers, **base).from_cache
        assert cached_ask(tmp_path, servers, **base).from_cache  # the same request: answered by the cache
        assert not cached_ask(tmp_path, servers, **{**base, **change}).from_cache, f"{field} is not in the cache key"
        assert server.count + other.count == 2


def complete_in_thread(client) -> tuple[threading.Thread, dict]:
    """client.complete on another thread; the dict gets its "reply" or "error", and "took"."""
    result = {}

    def run():
        started = time.monotonic()
        try:
            result["reply"] = client.complete(MESSAGES, 10)
        except CallError as exc:
            result["error"] = exc
        result["took"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def test_close_abandons_a_call_in_flight_and_refuses_later_ones(tmp_path, server):
    release = threading.Event()

    def script(request, number):
        release.wait(30)  # a server that answers in 30 s (let go at the end, so that it can stop)
        return None

    server.script = script
    client = client_for(tmp_path, server, "optimizer.timeout_s=60", *with_cache(tmp_path))
    try:
        thread, result = complete_in_thread(client)
        time.sleep(0.5)
        client.close()
        thread.join(15)
        assert not thread.is_alive() and "reply" not in result
        assert result["error"].cause == ABANDONED and result["took"] < 15  # well before the server answers
        with pytest.raises(CallError) as later:  # at once, without a request
            client.complete(MESSAGES, 10)
        assert later.value.cause == ABANDONED and server.count == 1
        client.forget([Reply("", "stop", Usage(), 0.0, cache_key="k")])  # a worker's forget after close is harmless
        client.close()  # and so is a second close
    finally:
        release.set()


@pytest.mark.parametrize("waiting_for", ["backoff", "rate_limit"])
def test_close_ends_a_wait_between_requests_at_once(tmp_path, server, waiting_for):
    if waiting_for == "backoff":  # a 503, then a 30 s wait before the retry
        server.script = lambda r, n: Response(503, error_body("unavailable"))
        overrides = ["optimizer.retry.initial_wait_s=30", "optimizer.retry.max_wait_s=30"]
    else:  # one request a minute: the second call waits for the limiter
        overrides = ["optimizer.rpm=1"]
    client = client_for(tmp_path, server, *overrides)
    if waiting_for == "rate_limit":
        client.complete(MESSAGES, 10)
    thread, result = complete_in_thread(client)
    time.sleep(0.5)
    client.close()
    thread.join(15)
    assert not thread.is_alive() and result["error"].cause == ABANDONED and result["took"] < 15
    assert server.count == 1  # no request after the close


def test_a_closed_cache_neither_answers_nor_keeps(tmp_path):
    cache = ResponseCache(tmp_path / "cache.db", CacheMode.read_write)
    cache.put("k", {"text": "t"})
    cache.close()
    cache.put("k2", {"text": "t"})  # a worker finishing after close: no error
    cache.forget(["k"])
    assert cache.get("k") is None
    reopened = ResponseCache(tmp_path / "cache.db", CacheMode.read_write)
    assert reopened.get("k") == {"text": "t"} and reopened.get("k2") is None
    reopened.close()
