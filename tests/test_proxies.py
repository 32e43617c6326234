"""Behind an OpenAI-compatible proxy (LiteLLM's and the like): the wait its 429s ask for, and which
400s turn structured output off. Through the real client and the loopback server."""

from __future__ import annotations

import logging
import time
from contextlib import closing

import pytest

from reflact.calls.client import make_client
from reflact.calls.protocol import CallError
from reflact.testing.optimizer_server import OptimizerServer, Response
from tests.conftest import make_config

MESSAGES = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
SCHEMA = {"type": "object", "properties": {"edits": {"type": "array"}}}


def client_for(tmp_path, server, *overrides):
    cfg = make_config(f"data.dir={tmp_path}", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
                      "optimizer.retry.initial_wait_s=0.01", "optimizer.retry.max_wait_s=60", "optimizer.cache=off",
                      *overrides)
    return make_client(cfg.optimizer, tmp_path, environ={})


def litellm_429(headers: dict):
    """LiteLLM's proxy passes an upstream 429 on with the upstream's headers renamed."""
    return lambda request, number: (
        Response(429, {"error": {"message": "litellm.RateLimitError: slow down", "code": "429"}}, headers=headers)
        if number == 1 else None
    )


@pytest.mark.parametrize("headers", [{"llm_provider-retry-after": "6"}, {"llm_provider-retry-after-ms": "6000"},
                                     {"retry-after-ms": "6000"}])
def test_a_proxys_retry_after_header_is_the_wait_asked_for(tmp_path, headers):
    """With 3 s of retrying allowed, a 6 s wait does not fit: the client gives up at once instead of
    retrying after its own 0.01 s backoff (which it does when the header is not there)."""
    with OptimizerServer(litellm_429(headers)) as server:
        with closing(client_for(tmp_path, server, "optimizer.retry.max_seconds=3")) as client:
            with pytest.raises(CallError) as failed:
                client.complete(MESSAGES, 10)
        assert server.count == 1 and failed.value.retries == 0 and "HTTP 429" in str(failed.value)
    with OptimizerServer(litellm_429({"x-litellm-model-id": "m"})) as server:
        with closing(client_for(tmp_path, server, "optimizer.retry.max_seconds=3")) as client:
            assert client.complete(MESSAGES, 10).retries == 1 and server.count == 2


@pytest.mark.slow
def test_a_litellm_429_asking_for_6_s_is_waited_out(tmp_path, caplog):
    arrivals = []

    def script(request, number):
        arrivals.append(time.monotonic())
        return litellm_429({"llm_provider-retry-after": "6"})(request, number)

    with OptimizerServer(script) as server, caplog.at_level(logging.INFO, logger="reflact"):
        with closing(client_for(tmp_path, server)) as client:
            reply = client.complete(MESSAGES, 10, label="minibatch_fail_000")
    assert reply.retries == 1 and server.count == 2
    lines = [r.getMessage() for r in caplog.records if "attempt" in r.getMessage()]
    assert lines == ["minibatch_fail_000: attempt 2/6 after HTTP 429 (Retry-After 6 s)"]
    assert arrivals[1] - arrivals[0] >= 6.0  # at least the wait asked for (a lower bound: cannot flake)


def refuse_schema_with(error: dict):
    """A 400 with `error` to every request that carries a JSON schema; valid replies otherwise."""
    return lambda request, number: (
        Response(400, {"error": error}) if "response_format" in request else None
    )


@pytest.mark.parametrize("error", [
    {"message": "response_format json_schema is not supported", "type": "invalid_request_error"},
    {"message": "Invalid value", "param": "response_format", "type": "invalid_request_error"},
    {"message": "litellm.BadRequestError: OpenAIException - Unsupported Response-Format for this model"},
    {"message": "'json_schema' or 'grammar' can be specified, not both"},  # llama.cpp's server
])
def test_a_400_about_the_schema_turns_structured_output_off_for_the_run(tmp_path, error, caplog):
    with OptimizerServer(refuse_schema_with(error)) as server, caplog.at_level(logging.WARNING, logger="reflact"):
        with closing(client_for(tmp_path, server, "optimizer.structured_output=auto")) as client:
            first = client.complete(MESSAGES, 10, schema=SCHEMA)
            second = client.complete(MESSAGES, 10, schema=SCHEMA)
    assert (first.structured, second.structured) == ("off", "off")
    assert ["response_format" in r for r in server.requests] == [True, False, False]
    assert [r.getMessage() for r in caplog.records] == [
        "the server rejected a JSON schema (HTTP 400); asking without one from now on"]


@pytest.mark.parametrize("error", [
    {"message": "litellm.AuthenticationError: No api key passed in.", "type": "invalid_request_error"},
    {"message": "Unsupported parameter: 'temperature'", "param": "temperature"},
    {"message": "bad request"},
])
def test_a_400_about_anything_else_fails_the_call_and_keeps_the_schema(tmp_path, error):
    script = refuse_schema_with(error)
    with OptimizerServer(lambda request, number: script(request, number) if number == 1 else None) as server:
        with closing(client_for(tmp_path, server, "optimizer.structured_output=auto")) as client:
            with pytest.raises(CallError) as failed:
                client.complete(MESSAGES, 10, schema=SCHEMA)
            later = client.complete(MESSAGES, 10, schema=SCHEMA)
    assert str(failed.value).startswith("HTTP 400") and failed.value.retries == 0
    # not asked again without the schema, and the next call still sends it
    assert ["response_format" in r for r in server.requests] == [True, True]
    assert later.structured == "json_schema"
