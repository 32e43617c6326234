"""Calling the optimizer model over the OpenAI SDK, with tenacity as the one retry policy."""

from __future__ import annotations

import email.utils
import os
import time
from dataclasses import dataclass, field

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_before_delay,
    wait_exponential_jitter,
)

from reflact.config import OptimizerConfig, Price
from reflact.errors import UserError


@dataclass
class Usage:
    prompt: int = 0
    cached: int = 0
    completion: int = 0
    reasoning: int = 0  # part of completion

    def add(self, other: "Usage") -> None:
        self.prompt += other.prompt
        self.cached += other.cached
        self.completion += other.completion
        self.reasoning += other.reasoning

    def cost_usd(self, price: Price | None) -> float:
        if price is None:
            return 0.0
        fresh = max(self.prompt - self.cached, 0)
        return (fresh * price.input + self.cached * price.cached_input + self.completion * price.output) / 1e6


@dataclass
class Reply:
    text: str
    finish_reason: str | None
    usage: Usage
    latency_s: float
    retries: int = 0


@dataclass
class CallError(Exception):
    """A call that still failed after the retry policy; `cause` is a one-line description."""

    cause: str
    retries: int = 0
    usage: Usage = field(default_factory=Usage)

    def __str__(self) -> str:
        return self.cause


class OptimizerClient:
    def __init__(self, cfg: OptimizerConfig, api_key: str) -> None:
        from openai import OpenAI  # imported here: the SDK is slow to import and --help needs none of it

        self.cfg = cfg
        # tenacity is the retry policy; SDK retries on top would multiply the attempts
        self._sdk = OpenAI(api_key=api_key, base_url=cfg.base_url, timeout=cfg.timeout_s, max_retries=0)

    def complete(self, messages: list[dict], max_output_tokens: int) -> Reply:
        request = self._request(messages, max_output_tokens)
        retrying = Retrying(
            retry=retry_if_exception(is_transient),
            stop=stop_after_attempt(self.cfg.retry.max_attempts) | stop_before_delay(self.cfg.retry.max_seconds),
            wait=wait_after(self.cfg.retry.initial_wait_s, self.cfg.retry.max_wait_s),
            reraise=True,
        )
        attempts = 0
        try:
            for attempt in retrying:
                with attempt:
                    attempts = attempt.retry_state.attempt_number
                    started = time.monotonic()
                    response = self._sdk.chat.completions.create(**request)
        except Exception as exc:  # noqa: BLE001 - every SDK failure becomes a recorded failed call
            raise CallError(describe_error(exc), retries=max(attempts - 1, 0)) from None
        choice = response.choices[0] if response.choices else None
        return Reply(
            text=(choice.message.content or "") if choice else "",
            finish_reason=choice.finish_reason if choice else None,
            usage=usage_of(response),
            latency_s=time.monotonic() - started,
            retries=attempts - 1,
        )

    def _request(self, messages: list[dict], max_output_tokens: int) -> dict:
        request = {"model": self.cfg.model, "messages": messages, self.cfg.token_limit_param: max_output_tokens}
        # optional parameters only when set: some compatible servers reject unknown ones
        if self.cfg.temperature is not None:
            request["temperature"] = self.cfg.temperature
        if self.cfg.reasoning_effort:
            request["reasoning_effort"] = self.cfg.reasoning_effort
        return request


def make_client(cfg: OptimizerConfig, environ: dict | None = None) -> OptimizerClient:
    """The one place a client is built from `optimizer.*`; the key comes from the environment."""
    environ = os.environ if environ is None else environ
    key = environ.get(cfg.api_key_env, "")
    if not key and not cfg.base_url:
        raise UserError(
            f"no optimizer key: set the environment variable {cfg.api_key_env} "
            "(or optimizer.base_url for a local OpenAI-compatible server)"
        )
    # local servers usually ignore the key, but the SDK insists on one
    return OptimizerClient(cfg, key or "not-needed")


def is_transient(exc: BaseException) -> bool:
    import openai

    if isinstance(exc, (openai.APITimeoutError, openai.APIConnectionError)):
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code == 429 or exc.status_code >= 500
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


def describe_error(exc: BaseException) -> str:
    import openai

    if isinstance(exc, openai.APIStatusError):
        return f"HTTP {exc.status_code}: {str(exc.message)[:300]}"
    if isinstance(exc, openai.APITimeoutError):
        return "timed out"
    if isinstance(exc, openai.APIConnectionError):
        return f"connection failed: {exc.__cause__ or exc}"[:300]
    return f"{type(exc).__name__}: {exc}"[:300]
