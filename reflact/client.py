"""The optimizer (reflact.optimizer.Optimizer) over the OpenAI SDK: any OpenAI-compatible server.

tenacity is the one retry policy (the SDK's own retries are off, or attempts multiply); the
response cache answers repeated requests without a call; the rate limiter paces all workers.
"""

from __future__ import annotations

import email.utils
import logging
import os
import threading
import time
from dataclasses import asdict
from pathlib import Path

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_before_delay,
    wait_exponential_jitter,
)

from reflact.cache import ResponseCache, cache_key
from reflact.config import CacheMode, OptimizerConfig, Provider, StructuredOutput
from reflact.errors import UserError
from reflact.optimizer import CallError, Reply, Usage, estimate_tokens
from reflact.ratelimit import RateLimiter

log = logging.getLogger("reflact")


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


class OptimizerClient:
    """Calls, with retries, the response cache and the rate limits of `optimizer.*`."""

    def __init__(self, cfg: OptimizerConfig, sdk: object, cache: ResponseCache | None = None, secret: str = "") -> None:
        self.cfg = cfg
        self._sdk = sdk
        self._secret = secret
        self.cache = cache
        self._limiter = RateLimiter(cfg.rpm, cfg.tpm) if (cfg.rpm or cfg.tpm) else None
        self._schema_rejected = threading.Event()  # `auto`: this server answered 400 to a JSON schema

    def complete(self, messages: list[dict], max_output_tokens: int, schema: dict | None = None) -> Reply:
        logical = self._request(messages, max_output_tokens)
        key = ""  # hashing the whole request only pays when there is a cache to ask
        if self.cache:
            key = cache_key({**logical, "structured_output": self.cfg.structured_output.value,
                             "schema": schema, "sample": self.cfg.sample})
            hit = self.cache.get(key)
            if hit is not None:
                return Reply(hit["text"], hit["finish_reason"], Usage(**hit.get("usage", {})), 0.0,
                             from_cache=True, structured=hit.get("structured", "off"), started_at=time.time(),
                             cache_key=key)
        reply = self._call_with_retries(logical, schema, estimate_tokens(messages) + max_output_tokens)
        reply.cache_key = key
        if self.cache:
            self.cache.put(key, {"text": reply.text, "finish_reason": reply.finish_reason,
                                 "structured": reply.structured, "usage": asdict(reply.usage)})
        return reply

    def close(self) -> None:
        """Release the HTTP connections and the cache's database handle."""
        self._sdk.close()
        if self.cache:
            self.cache.close()

    def forget(self, replies: list[Reply]) -> None:
        if self.cache:
            self.cache.forget([r.cache_key for r in replies if r.cache_key])

    def _request(self, messages: list[dict], max_output_tokens: int) -> dict:
        request = {"model": self.cfg.model, "messages": messages, self.cfg.token_limit_param: max_output_tokens}
        # optional parameters only when set: some compatible servers reject unknown ones
        if self.cfg.temperature is not None:
            request["temperature"] = self.cfg.temperature
        if self.cfg.reasoning_effort:
            request["reasoning_effort"] = self.cfg.reasoning_effort
        return request

    def _response_format(self, schema: dict | None) -> tuple[str, dict | None]:
        setting = self.cfg.structured_output
        if setting is StructuredOutput.json_object:
            return "json_object", {"type": "json_object"}
        wants_schema = setting is StructuredOutput.json_schema or (
            setting is StructuredOutput.auto and not self._schema_rejected.is_set()
        )
        if wants_schema and schema is not None:
            return "json_schema", {"type": "json_schema",
                                   "json_schema": {"name": "reflect_reply", "schema": schema, "strict": False}}
        return "off", None

    def _call_with_retries(self, logical: dict, schema: dict | None, tokens: int) -> Reply:
        retrying = Retrying(
            retry=retry_if_exception(is_transient),
            stop=stop_after_attempt(self.cfg.retry.max_attempts) | stop_before_delay(self.cfg.retry.max_seconds),
            wait=wait_after(self.cfg.retry.initial_wait_s, self.cfg.retry.max_wait_s),
            reraise=True,
        )
        sent = [0]  # requests made, the retries' included
        try:
            for attempt in retrying:
                with attempt:
                    response, started, wall, structured = self._send(logical, schema, tokens, sent)
        except Exception as exc:  # noqa: BLE001 - every SDK failure becomes a recorded failed call
            raise CallError(describe_error(exc, self._secret), retries=max(sent[0] - 1, 0)) from None
        choice = response.choices[0] if response.choices else None
        return Reply(
            text=(choice.message.content or "") if choice else "",
            finish_reason=choice.finish_reason if choice else None,
            usage=usage_of(response),
            latency_s=time.monotonic() - started,
            retries=sent[0] - 1,
            structured=structured,
            started_at=wall,
        )

    def _send(self, logical: dict, schema: dict | None, tokens: int, sent: list[int]) -> tuple:
        """One attempt: (response, monotonic and wall start, response format sent). With
        structured_output=auto, a 400 to the JSON schema is asked again without it, here."""
        import openai

        structured, response_format = self._response_format(schema)
        # as extra_body: the SDK's typed transform of a nested schema costs ~1.5 ms a call
        request = {**logical, "extra_body": {"response_format": response_format}} if response_format else logical
        try:
            return *self._create(request, tokens, sent), structured
        except openai.BadRequestError:
            if structured != "json_schema" or self.cfg.structured_output is not StructuredOutput.auto:
                raise
        if not self._schema_rejected.is_set():
            self._schema_rejected.set()
            log.warning("the server rejected a JSON schema (HTTP 400); asking without one from now on")
        return *self._create(logical, tokens, sent), "off"

    def _create(self, request: dict, tokens: int, sent: list[int]) -> tuple:
        """(response, monotonic and wall-clock start) of one request."""
        sent[0] += 1
        if self._limiter:  # every attempt is a request: retries are paced too
            self._limiter.acquire(tokens)
        started, wall = time.monotonic(), time.time()
        return self._sdk.chat.completions.create(**request), started, wall


def make_client(cfg: OptimizerConfig, launch_dir: Path, environ: dict | None = None) -> OptimizerClient:
    """The one place a client is built from `optimizer.*`; the key comes from the environment."""
    environ = os.environ if environ is None else environ
    key = environ.get(cfg.api_key_env, "")
    if not key and not cfg.base_url:
        raise UserError(
            f"no optimizer key: set the environment variable {cfg.api_key_env} "
            "(or optimizer.base_url for a local OpenAI-compatible server)"
        )
    import openai  # imported here: the SDK is slow to import and --help needs none of it

    # local servers usually ignore the key, but the SDK insists on one
    common = {"api_key": key or "not-needed", "timeout": cfg.timeout_s, "max_retries": 0}
    if cfg.provider is Provider.azure:
        sdk = openai.AzureOpenAI(azure_endpoint=cfg.azure.endpoint, azure_deployment=cfg.azure.deployment,
                                 api_version=cfg.azure.api_version, **common)
    else:
        sdk = openai.OpenAI(base_url=cfg.base_url, **common)
    # the SDK imports its chat module on first use, under a lock: done here, workers don't queue on it
    sdk.chat.completions
    cache = None
    if cfg.cache is not CacheMode.off:
        path = Path(cfg.cache_path) if cfg.cache_path else launch_dir / "outputs" / "cache.db"
        cache = ResponseCache(path, cfg.cache)
    return OptimizerClient(cfg, sdk, cache, secret=key)


def is_transient(exc: BaseException) -> bool:
    import json

    import openai

    # a 200 whose body is not JSON, or not a completion, is a proxy's page or a torn response
    if isinstance(exc, (openai.APITimeoutError, openai.APIConnectionError, openai.APIResponseValidationError,
                        json.JSONDecodeError)):
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in (408, 409, 429) or exc.status_code >= 500
    return False


def wait_after(initial: float, maximum: float):
    """Wait what the server's Retry-After says, else exponential backoff with jitter."""
    backoff = wait_exponential_jitter(multiplier=initial, jitter=initial, max=maximum)

    def wait(state: RetryCallState) -> float:
        hinted = retry_after_s(state.outcome.exception()) if state.outcome else None
        return hinted if hinted is not None else backoff(state)

    return wait


def retry_after_s(exc: BaseException | None) -> float | None:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if not headers:
        return None
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return max(float(millis) / 1000.0, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:  # the HTTP-date form
        return max(email.utils.parsedate_to_datetime(value).timestamp() - time.time(), 0.0)
    except (TypeError, ValueError):
        return None


def usage_of(response: object) -> Usage:
    usage = getattr(response, "usage", None)
    if usage is None:
        return Usage()
    prompt_details = getattr(usage, "prompt_tokens_details", None)
    completion_details = getattr(usage, "completion_tokens_details", None)
    return Usage(
        prompt=usage.prompt_tokens or 0,
        cached=(getattr(prompt_details, "cached_tokens", 0) or 0) if prompt_details else 0,
        completion=usage.completion_tokens or 0,
        reasoning=(getattr(completion_details, "reasoning_tokens", 0) or 0) if completion_details else 0,
    )


def describe_error(exc: BaseException, secret: str = "") -> str:
    """One line about a failed call, with the key redacted before anything is cut."""
    import openai

    if isinstance(exc, openai.APIStatusError):
        text = f"HTTP {exc.status_code}: {exc.message}"
    elif isinstance(exc, openai.APITimeoutError):
        text = "timed out"
    elif isinstance(exc, openai.APIConnectionError):
        text = f"connection failed: {exc.__cause__ or exc}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    text = " ".join(redact(text, secret).split())
    return text if len(text) <= 300 else text[:299] + "…"
