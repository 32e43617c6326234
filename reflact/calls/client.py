"""The optimizer (reflact.calls.protocol.Optimizer) over the OpenAI SDK: any OpenAI-compatible server.

tenacity is the one retry policy (the SDK's own retries are off, or attempts multiply); the
response cache answers repeated requests without a call; the rate limiter paces all workers.
Requests go through the SDK's async client on one background event loop (`Transport`): only
there can a request be bounded as a whole (the HTTP timeouts bound each read, so a server
sending a byte a second never times out) and be abandoned from another thread on close().
Every reply body is read by reflact.calls.completion, never trusted as it comes.

With `optimizer.service_tier` the tier goes with each request (flex: the longer
`flex_timeout_s`; a 429 "resource unavailable" is asked again and is no fault, after
`flex_fallback_after` of them the request goes at auto). With `optimizer.execution=batch` the
replies come from the response cache, put there by a batch (reflact.running.batch): a batch's
line is the call of the first run that uses it; a request the batch did not answer is not sent
(`gate`), except a re-ask with `optimizer.batch_reasks=live`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import email.utils
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# the SDK is slow to import: this module is imported only when a real client is made (--help needs none)
import anyio
import openai
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_any,
    stop_before_delay,
    wait_exponential_jitter,
)
from tenacity.stop import stop_base

from reflact.calls.cache import ResponseCache, cache_entry, cache_key, used_reply
from reflact.calls.completion import Completion, MalformedReply, read_completion
from reflact.calls.deferred import api_key
from reflact.calls.protocol import CallError, Optimizer, Reply, estimate_tokens
from reflact.calls.ratelimit import RateLimiter
from reflact.config import CacheMode, OptimizerConfig, Provider, ServiceTier, StructuredOutput
from reflact.core.imports import resolve_lazy
from reflact.core.launch import LaunchDir
from reflact.core.text import one_line

log = logging.getLogger("reflact")

ABANDONED = "abandoned: the run is stopping"
# how long a worker waits past optimizer.timeout_s before it stops waiting for the event loop
# itself (which only a bug could stall): a request's own deadline is timeout_s
LOOP_GRACE_S = 30.0
CLOSE_WAIT_S = 5.0  # close() waits this long at most for the connections to be shut


class Abandoned(Exception):
    """The client was closed: the request was cancelled, or never sent."""


@dataclass
class Attempts:
    """One request's attempts: every one sent, and the flex 429s among them (never billed, no fault)."""

    sent: int = 0
    unavailable: int = 0
    fell_back: bool = False  # flex_fallback_after reached: sent at auto from now on

    @property
    def faults(self) -> int:
        return self.sent - self.unavailable


class FaultsReached(stop_base):
    """tenacity's stop after `limit` faults of one request (flex 429s are none)."""

    def __init__(self, tries: Attempts, limit: int) -> None:
        self.tries, self.limit = tries, limit

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self.tries.faults >= self.limit


# what a failed call raises (the SDK's errors, a body that is not a completion, a deadline, a
# close); only these become a recorded failed call
CALL_FAULTS = (openai.OpenAIError, MalformedReply, Abandoned, TimeoutError)


def redact(text: str, secret: str) -> str:
    """Error texts can echo the key (or its last 8 characters), also URL-encoded or JSON-escaped
    when a server quotes the request back; none of it may reach a log or a file."""
    if not secret:
        return text
    import re

    def hex_digits(number: int, width: int) -> str:  # either case: %2f and %2F, \u002f and \u002F
        return "".join(f"[{d}{d.upper()}]" if d.isalpha() else d for d in f"{number:0{width}x}")

    def char(ch: str) -> str:
        forms = [re.escape(ch), "".join("%" + hex_digits(byte, 2) for byte in ch.encode("utf-8"))]
        if ord(ch) <= 0xFFFF:
            forms.append(r"\\u" + hex_digits(ord(ch), 4))
        if ch in '/"\\':
            forms.append(re.escape("\\" + ch))
        if ch == " ":
            forms.append(r"\+")  # a form-encoded space
        return "(?:" + "|".join(forms) + ")"

    parts = [secret, secret[-8:]] if len(secret) >= 16 else [secret]
    echoed = re.compile("|".join("".join(map(char, part)) for part in parts))
    return echoed.sub("***", text)


_loop_lock = threading.Lock()
_loop: tuple[int, asyncio.AbstractEventLoop] | None = None


def http_loop() -> asyncio.AbstractEventLoop:
    """The process's one event loop for optimizer requests, on a daemon thread shared by every
    client (a client never closed leaves no thread behind); made anew in a forked child."""
    global _loop
    with _loop_lock:
        if _loop is None or _loop[0] != os.getpid():
            loop = asyncio.new_event_loop()
            resolve_lazy(anyio)  # the SDK's transport loads anyio's parts as it first uses them
            threading.Thread(target=loop.run_forever, name="reflact-http", daemon=True).start()
            _loop = (os.getpid(), loop)
        return _loop[1]


class Transport:
    """Sends chat requests through the async SDK, each bounded as a whole by `timeout_s`, and
    abandons them all on close(). Workers call post() from their own threads."""

    def __init__(self, sdk: Any, timeout_s: float) -> None:
        self._sdk = sdk
        self._timeout_s = timeout_s
        self._loop = http_loop()
        self._lock = threading.Lock()
        self._inflight: set[concurrent.futures.Future] = set()
        self.closing = threading.Event()

    def post(self, request: dict) -> bytes:
        """The body of a 2xx reply; the SDK's errors for the others."""
        with self._lock:  # checked and registered at once: close() cancels every request that started
            if self.closing.is_set():
                raise Abandoned()
            future = asyncio.run_coroutine_threadsafe(self._post(request), self._loop)
            self._inflight.add(future)
        try:
            return future.result(timeout=self._timeout_s + LOOP_GRACE_S)
        except concurrent.futures.CancelledError:
            raise Abandoned() from None
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise
        finally:
            with self._lock:
                self._inflight.discard(future)

    async def _post(self, request: dict) -> bytes:
        async with asyncio.timeout(self._timeout_s):  # connect to last byte
            raw = await self._sdk.chat.completions.with_raw_response.create(**request)
            return raw.http_response.content

    def close(self) -> None:
        """Cancels the requests in flight (their workers get Abandoned at once), refuses new
        ones, and shuts the connections."""
        with self._lock:
            if self.closing.is_set():
                return
            self.closing.set()
            pending = list(self._inflight)
        for future in pending:
            future.cancel()
        try:
            asyncio.run_coroutine_threadsafe(self._sdk.close(), self._loop).result(timeout=CLOSE_WAIT_S)
        except Exception as exc:  # the run is ending; a socket left to the OS is no failure
            log.debug("closing the optimizer's connections: %s", exc)


class EndpointWatch:
    """Whether the endpoint has answered yet, and whether it was judged unusable: a refused
    connection, an unknown host or a 401/403/404 before any reply. Faults after a reply are the
    requests' own and are retried (or not) as usual."""

    def __init__(self) -> None:
        self.answered = threading.Event()  # a request got a 2xx reply
        self._lock = threading.Lock()
        self.message = ""  # why the endpoint is unusable, and what to check
        self.cause = ""  # the request's own one-line cause

    def judge(self, exc: BaseException, cfg: OptimizerConfig, url: str, secret: str) -> bool:
        """True when this failure makes the endpoint unusable (the first such one only)."""
        if self.answered.is_set() or not endpoint_fault(exc):
            return False
        with self._lock:
            if self.message:
                return False
            self.cause = describe_error(exc, secret)
            self.message = fault_message(cfg, url, exc, self.cause)
            return True

    def ended(self, retries: int = 0) -> CallError:
        """The failure of a request made or refused after close(), or after the endpoint failed."""
        if self.message:
            return CallError(self.cause, retries=retries, fatal=self.message)
        return CallError(ABANDONED, retries=retries)


class Shapes:
    """What a request is and how it goes: its response cache key (the endpoint, model, messages,
    decoding, structured output and schema, sample), its body with the response format, and the
    tier it asks for. The client sends what it shapes; a batch's lines are shaped by the same
    (reflact.running.batch_requests)."""

    def __init__(self, cfg: OptimizerConfig, endpoint: dict) -> None:
        self.cfg = cfg
        self.endpoint = endpoint  # which server answers: part of the cache key
        self.schema_rejected = threading.Event()  # `auto`: this server answered 400 to a JSON schema
        self._fallback_said = threading.Event()  # flex_fallback_after's one warning

    def keyed(
        self,
        messages: list[dict],
        max_output_tokens: int,
        schema: dict | None = None,
        sample: int | None = None,
        hashed: bool = True,
    ) -> tuple[str, dict]:
        """(the cache key, "" unless `hashed`: hashing the whole request only pays when there is a
        cache to ask; the request before any response format)."""
        sample = self.cfg.sample if sample is None else sample
        logical = request_body(self.cfg, messages, max_output_tokens, sample)
        if not hashed:
            return "", logical
        shape = {**logical, "endpoint": self.endpoint, "schema": schema, "sample": sample}
        return cache_key({**shape, "structured_output": self.cfg.structured_output.value}), logical

    def request(self, logical: dict, schema: dict | None, tries: Attempts, label: str) -> tuple[dict, str]:
        """(the request as the SDK takes it, its response format and tier as extra_body; the response
        format recorded). As extra_body: the SDK's typed transform of a nested schema costs ~1.5 ms a call."""
        body, structured = self.as_sent(logical, schema)
        extra = {key: body[key] for key in ("response_format",) if key in body}
        tier = self.tier(tries, label)
        if tier:
            extra["service_tier"] = tier
        return ({**logical, "extra_body": extra} if extra else logical), structured

    def as_sent(self, logical: dict, schema: dict | None) -> tuple[dict, str]:
        """(the request's body as it is sent, the response format it holds as recorded): a batch's line."""
        structured, response_format = response_format_for(
            self.cfg.structured_output, schema, self.schema_rejected.is_set()
        )
        return ({**logical, "response_format": response_format} if response_format else logical), structured

    def tier(self, tries: Attempts, label: str) -> str:
        """The tier this attempt asks for ("" for auto: nothing sent); flex until flex_fallback_after
        429s "resource unavailable" for this request, then auto, with one warning for the run."""
        tier, after = self.cfg.service_tier, self.cfg.flex_fallback_after
        if tier is ServiceTier.auto or tries.fell_back:
            return ""
        if tier is ServiceTier.flex and after is not None and tries.unavailable >= after:
            tries.fell_back = True
            if not self._fallback_said.is_set():
                self._fallback_said.set()
                log.warning(
                    "%s: flex capacity unavailable %d times; sent at auto (listed price) from then on, as "
                    "optimizer.flex_fallback_after=%d says (each such request is recorded with its tier)",
                    label or "a request",
                    tries.unavailable,
                    after,
                )
            return ""
        return tier.value


class OptimizerClient(Optimizer):  # made whole by make_client: `ready` has nothing to do
    """Calls, with retries, the response cache and the rate limits of `optimizer.*`."""

    def __init__(
        self,
        cfg: OptimizerConfig,
        sdk: Any,
        cache: ResponseCache | None = None,
        secret: str = "",
        endpoint: dict | None = None,
        gate: Callable[[str, bool], str | None] | None = None,
    ) -> None:
        """`gate(key, first)`: with batch execution, why a request the cache does not answer is not
        sent (None: send it); `first` is a conversation's first request, not a re-ask."""
        self.cfg = cfg
        self._transport = Transport(sdk, request_timeout(cfg))
        self._gate = gate
        self._secret = secret
        self.cache = cache
        self.shapes = Shapes(cfg, endpoint or {})
        self._limiter = RateLimiter(cfg.rpm, cfg.tpm, stop=self._transport.closing) if (cfg.rpm or cfg.tpm) else None
        self._warned: set[str] = set()  # the usage fields already warned about
        self._watch = EndpointWatch()

    def complete(
        self,
        messages: list[dict],
        max_output_tokens: int,
        schema: dict | None = None,
        sample: int | None = None,
        label: str = "",
    ) -> Reply:
        """`sample`: the draw's sample index (default optimizer.sample), in the cache key and, with
        optimizer.samples > 1, sent as the request's seed; `label` names the request in retry lines."""
        if self._stopped():
            raise self._watch.ended()
        key, logical = self.shapes.keyed(messages, max_output_tokens, schema, sample, hashed=bool(self.cache))
        hit = used_reply(self.cache, key) if self.cache else None
        if hit is not None:
            return hit
        refused = self._gate(key, len(messages) <= 2) if self._gate is not None else None
        if refused is not None:
            raise CallError(refused)
        reply = self._call_with_retries(logical, schema, estimate_tokens(messages) + max_output_tokens, label)
        reply.cache_key = key
        if self.cache:
            self.cache.put(key, cache_entry(reply))
        return reply

    def close(self) -> None:
        """Abandon the calls in flight (each ends at once as a CallError), refuse new ones, and
        release the HTTP connections and the cache's database handle. Safe from any thread."""
        self._transport.close()
        if self.cache:
            self.cache.close()

    def forget(self, replies: list[Reply]) -> None:
        if self.cache:
            self.cache.forget([r.cache_key for r in replies if r.cache_key])

    def _call_with_retries(self, logical: dict, schema: dict | None, tokens: int, label: str = "") -> Reply:
        closing = self._transport.closing
        tries = Attempts()
        retry = self.cfg.retry
        retrying = Retrying(
            retry=retry_if_exception(lambda exc: is_transient(exc) and not self._stopped()),
            # a flex 429 is no fault: it uses up time (retry.max_seconds), not attempts
            stop=stop_any(FaultsReached(tries, retry.max_attempts), stop_before_delay(retry.max_seconds)),
            wait=wait_after(retry.initial_wait_s, retry.max_wait_s),
            sleep=closing.wait,  # type: ignore[arg-type]  # Event.wait's bool is ignored; a backoff ends early when the client is closed
            before_sleep=lambda state: say_retry(label, state, retry.max_attempts, self._secret, tries),
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    completion, started, wall, structured = self._send(logical, schema, tokens, tries, label)
        except CALL_FAULTS as exc:  # a failure of the call; anything else is a bug, with its traceback
            if self._stopped():
                raise self._watch.ended(retries=max(tries.faults - 1, 0)) from None
            raise CallError(describe_error(exc, self._secret), retries=max(tries.faults - 1, 0)) from None
        return Reply(
            text=completion.text,
            finish_reason=completion.finish_reason,
            usage=completion.usage,
            latency_s=time.monotonic() - started,
            retries=tries.faults - 1,
            structured=structured,
            started_at=wall,
            service_tier=completion.service_tier,
            flex_unavailable=tries.unavailable,
        )

    def _send(self, logical: dict, schema: dict | None, tokens: int, tries: Attempts, label: str) -> tuple:
        """One attempt: (completion, monotonic and wall start, response format sent). With
        structured_output=auto, a 400 to the JSON schema is asked again without it, here."""
        request, structured = self.shapes.request(logical, schema, tries, label)
        try:
            return *self._create(request, tokens, tries), structured
        except openai.BadRequestError as exc:
            auto = structured == "json_schema" and self.cfg.structured_output is StructuredOutput.auto
            if not auto or not about_schema(exc):
                raise
        if not self.shapes.schema_rejected.is_set():
            self.shapes.schema_rejected.set()
            log.warning("the server rejected a JSON schema (HTTP 400); asking without one from now on")
        tier = {k: v for k, v in request.get("extra_body", {}).items() if k == "service_tier"}
        return *self._create({**logical, "extra_body": tier} if tier else logical, tokens, tries), "off"

    def _create(self, request: dict, tokens: int, tries: Attempts) -> tuple[Completion, float, float]:
        """(completion, monotonic and wall-clock start) of one request, its body checked."""
        if self._stopped():
            raise Abandoned()
        tries.sent += 1
        if self._limiter:  # every attempt is a request: retries are paced too
            self._limiter.acquire(tokens)
        started, wall = time.monotonic(), time.time()
        try:
            body = self._transport.post(request)
        except Exception as exc:
            if request.get("extra_body", {}).get("service_tier") == "flex" and flex_unavailable(exc):
                tries.unavailable += 1  # no capacity now: not the endpoint's fault, asked again
            # before any reply, every call of the run would fail the same way: none is sent again
            elif self._watch.judge(exc, self.cfg, self.shapes.endpoint.get("base_url", ""), self._secret):
                self._transport.close()
            raise
        self._watch.answered.set()
        completion = read_completion(body, self._warn)
        # a server may quote the request back, key and all: nothing stored may hold it
        completion.text = redact(completion.text, self._secret)
        return completion, started, wall

    @property
    def fault(self) -> str:
        """ "" while the endpoint may be usable; else why not, and what to check (one line)."""
        return self._watch.message

    def _stopped(self) -> bool:
        """Closed, or the endpoint was judged unusable (checked before close() is through)."""
        return self._transport.closing.is_set() or bool(self._watch.message)

    def _warn(self, field: str, what: str) -> None:
        if field not in self._warned:  # once per field: a server that always sends it would flood the log
            self._warned.add(field)
            log.warning("the optimizer's reply: %s %s (token and cost totals may be off)", field, what)


def request_body(cfg: OptimizerConfig, messages: list[dict], max_output_tokens: int, sample: int) -> dict:
    """The request as the cache keys it, before any response format."""
    request = {"model": cfg.model, "messages": messages, cfg.token_limit_param: max_output_tokens}
    # optional parameters only when set: some compatible servers reject unknown ones
    if cfg.temperature is not None:
        request["temperature"] = cfg.temperature
    if cfg.reasoning_effort:
        request["reasoning_effort"] = cfg.reasoning_effort
    if cfg.samples > 1:  # repeated draws: each its own seed, so a seeded server varies them
        request["seed"] = sample
    return request


def request_timeout(cfg: OptimizerConfig) -> float:
    """The longest one request may take: flex replies are slower (OpenAI suggests 900 s)."""
    return cfg.flex_timeout_s if cfg.service_tier is ServiceTier.flex else cfg.timeout_s


def flex_unavailable(exc: BaseException) -> bool:
    """A flex request's 429 "resource unavailable": no capacity now, not billed, asked again."""
    if not isinstance(exc, openai.APIStatusError) or exc.status_code != 429:
        return False
    text = f"{getattr(exc, 'code', None) or ''} {exc.message}".lower().replace("_", " ")
    return "resource unavailable" in text


def response_format_for(
    setting: StructuredOutput, schema: dict | None, schema_rejected: bool
) -> tuple[str, dict | None]:
    """(what is sent, as recorded: json_schema, json_object or off; the response_format itself)."""
    if setting is StructuredOutput.json_object:
        return "json_object", {"type": "json_object"}
    wants_schema = setting is StructuredOutput.json_schema or (setting is StructuredOutput.auto and not schema_rejected)
    if wants_schema and schema is not None:
        return "json_schema", {
            "type": "json_schema",
            "json_schema": {"name": "reflect_reply", "schema": schema, "strict": False},
        }
    return "off", None


def endpoint_of(cfg: OptimizerConfig, sdk: Any) -> dict:
    """Which server answers (the SDK's resolved base URL, the default's included; for Azure also
    the deployment and API version): a reply is never served from cache for another server."""
    endpoint: dict[str, str | None] = {"provider": cfg.provider.value, "base_url": str(sdk.base_url)}
    if cfg.provider is Provider.azure:
        endpoint.update(deployment=cfg.azure.deployment, api_version=cfg.azure.api_version)
    return endpoint


def make_client(
    cfg: OptimizerConfig,
    launch_dir: Path,
    environ: Mapping[str, str] | None = None,
    gate: Callable[[str, bool], str | None] | None = None,
) -> OptimizerClient:
    """The one place a client is built from `optimizer.*`; the key comes from the environment.
    `gate`: batch execution's rule for requests the cache does not answer (OptimizerClient)."""
    key = api_key(cfg, os.environ if environ is None else environ)
    # local servers usually ignore the key, but the SDK insists on one
    common: dict[str, Any] = {"api_key": key or "not-needed", "timeout": request_timeout(cfg), "max_retries": 0}
    sdk: openai.AsyncOpenAI
    if cfg.provider is Provider.azure:
        sdk = openai.AsyncAzureOpenAI(
            azure_endpoint=cfg.azure.endpoint,  # type: ignore[arg-type]  # None: the SDK reads AZURE_OPENAI_ENDPOINT
            azure_deployment=cfg.azure.deployment,
            api_version=cfg.azure.api_version,
            **common,
        )
    else:
        sdk = openai.AsyncOpenAI(base_url=cfg.base_url, **common)
    # the SDK imports its chat module on first use, under a lock: done here, workers don't queue on it
    _ = sdk.chat.completions.with_raw_response
    cache = None
    if cfg.cache is not CacheMode.off:
        cache = ResponseCache(LaunchDir(launch_dir).cache(cfg.cache_path), cfg.cache)
    return OptimizerClient(cfg, sdk, cache, secret=key, endpoint=endpoint_of(cfg, sdk), gate=gate)


def is_transient(exc: BaseException) -> bool:
    # a 200 whose body is not a completion is a proxy's page or a torn response: worth another try
    if isinstance(
        exc,
        (
            openai.APITimeoutError,
            openai.APIConnectionError,
            openai.APIResponseValidationError,
            TimeoutError,
            MalformedReply,
        ),
    ):
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in (408, 409, 429) or exc.status_code >= 500
    return False


# what a 400 refusing structured output names (OpenAI's `param`, vLLM's guided decoding, llama.cpp's
# and Ollama's format checks); a 400 naming none of them (a proxy's missing key, a bad parameter)
# is the request's own failure and leaves structured output on
SCHEMA_WORDS = ("response_format", "response format", "json_schema", "schema", "structured output", "guided_json")


def about_schema(exc: openai.BadRequestError) -> bool:
    """Whether a 400 is about the JSON schema sent: the one 400 that `auto` answers by asking again
    without it, for the rest of the run."""
    text = f"{getattr(exc, 'param', None) or ''} {getattr(exc, 'code', None) or ''} {exc.message}".lower()
    return any(word in text.replace("-", "_") for word in SCHEMA_WORDS)


def endpoint_fault(exc: BaseException) -> bool:
    """A fault of the endpoint itself (no connection, no such host, a refused key, no such model or
    path), as opposed to one of a request (a timeout, a rate limit, a server error)."""
    if isinstance(exc, openai.APITimeoutError):  # a subclass of APIConnectionError: a slow server
        return False
    if isinstance(exc, openai.APIConnectionError):
        return True
    return isinstance(exc, openai.APIStatusError) and exc.status_code in (401, 403, 404)


def fault_message(cfg: OptimizerConfig, url: str, exc: BaseException, cause: str) -> str:
    """One line for an unusable endpoint: the URL (never a key: keys are never in it, see config)
    and what to check."""
    status = getattr(exc, "status_code", None)
    if status in (401, 403):
        check = f"check the key in ${cfg.api_key_env} (optimizer.api_key_env) and that it may use {cfg.model!r}"
    elif status == 404:
        check = f"check optimizer.model ({cfg.model!r}) and optimizer.base_url (most servers end it in /v1)"
    else:
        check = "check optimizer.base_url and that the server is running"
    return f"the optimizer at {url} did not answer the first requests ({cause}): {check}"


def _sleep_s(state: RetryCallState) -> float:
    """The backoff before the next attempt (set whenever tenacity is about to sleep)."""
    return state.next_action.sleep if state.next_action is not None else 0.0


def say_retry(label: str, state: RetryCallState, attempts: int, secret: str, tries: Attempts | None = None) -> None:
    """One line per retry, so retries in progress are seen: which request, its next attempt, why."""
    exc = state.outcome.exception() if state.outcome else None
    hinted = retry_after_s(exc)
    wait = f"Retry-After {hinted:g} s" if hinted is not None else f"waiting {_sleep_s(state):.1f} s"
    if tries is not None and tries.unavailable and exc is not None and flex_unavailable(exc):
        log.info("%s: flex capacity unavailable (HTTP 429, not billed); asking again (%s)", label or "a request", wait)
        return
    log.info(
        "%s: attempt %d/%d after %s (%s)",
        label or "a request",
        (tries.faults if tries is not None else state.attempt_number) + 1,
        attempts,
        short_cause(exc, secret),
        wait,
    )


def short_cause(exc: BaseException | None, secret: str = "") -> str:
    """A retry line's cause: the status alone for an HTTP error (its message is in the record)."""
    if isinstance(exc, openai.APIStatusError):
        return f"HTTP {exc.status_code}"
    text = describe_error(exc, secret) if exc is not None else "an error"
    return text if len(text) <= 120 else text[:119] + "…"


def wait_after(initial: float, maximum: float):
    """Wait what the server's Retry-After says, else exponential backoff with jitter."""
    backoff = wait_exponential_jitter(multiplier=initial, jitter=initial, max=maximum)

    def wait(state: RetryCallState) -> float:
        hinted = retry_after_s(state.outcome.exception()) if state.outcome else None
        # a hint is capped by retry.max_wait_s: a server (or a proxy in front of it) asking for an
        # hour must not park a worker longer than the user allows between two attempts
        return min(hinted, maximum) if hinted is not None else backoff(state)

    return wait


# where a server, or a proxy in front of it, says how long to wait: LiteLLM's proxy passes the
# upstream's headers on with an `llm_provider-` prefix (its 429s carry no plain Retry-After)
RETRY_AFTER_MS = ("retry-after-ms", "llm_provider-retry-after-ms")
RETRY_AFTER = ("retry-after", "llm_provider-retry-after")


def retry_after_s(exc: BaseException | None) -> float | None:
    """The server's hint in seconds (a -ms header, else Retry-After as seconds or an HTTP date, each
    plain or as LiteLLM forwards it), never negative; None when absent or unreadable (garbage, NaN,
    infinite): the backoff applies."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if not headers:
        return None
    for name in RETRY_AFTER_MS:
        millis = seconds_in(headers.get(name), 1000.0)
        if millis is not None:
            return millis
    for name in RETRY_AFTER:
        seconds = seconds_or_date(headers.get(name))
        if seconds is not None:
            return seconds
    return None


def seconds_or_date(value: str | None) -> float | None:
    seconds = seconds_in(value, 1.0)
    return seconds if seconds is not None or not value else seconds_until(value)


def seconds_in(value: str | None, per_second: float) -> float | None:
    if not value:
        return None
    try:
        seconds = float(value) / per_second
    except ValueError:
        return None
    return max(seconds, 0.0) if math.isfinite(seconds) else None


def seconds_until(http_date: str) -> float | None:
    try:
        return max(email.utils.parsedate_to_datetime(http_date).timestamp() - time.time(), 0.0)
    except (TypeError, ValueError, OverflowError, IndexError):
        return None


def describe_error(exc: BaseException, secret: str = "") -> str:
    """One line about a failed call, with the key redacted before anything is cut."""
    if isinstance(exc, Abandoned):
        text = ABANDONED
    elif isinstance(exc, MalformedReply):
        text = str(exc)
    elif isinstance(exc, openai.APIStatusError):
        text = f"HTTP {exc.status_code}: {exc.message}"
    elif isinstance(exc, (openai.APITimeoutError, TimeoutError)):
        text = "timed out"
    elif isinstance(exc, openai.APIConnectionError):
        text = f"connection failed: {exc.__cause__ or exc}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    return one_line(redact(text, secret))
