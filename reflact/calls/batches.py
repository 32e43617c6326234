"""The Batch API over the OpenAI SDK (`/v1/files`, `/v1/batches`), and the JSONL lines it reads and writes.

Each call is retried by tenacity as a chat request is (5xx, 429, 408/409, timeouts, dropped
connections; `optimizer.retry.*`), the SDK's own retries off; one that still fails is a
`BatchFault` with a one-line cause. A server without batches (404 on `/v1/batches`) is
`NoBatchApi`. What reflact.running.batch does with them (the state, the rounds) is its own.

Line formats (OpenAI's, which vLLM's `run-batch` and LiteLLM's proxy share): an input line is
`{"custom_id", "method": "POST", "url", "body"}`; an output line `{"id", "custom_id",
"response": {"status_code", "body"}, "error"}`, in no particular order.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_before_delay

from reflact.calls.client import describe_error, is_transient, short_cause, wait_after
from reflact.calls.completion import Completion, MalformedReply, read_completion
from reflact.calls.deferred import api_key
from reflact.config import OptimizerConfig, Provider, RetryConfig

log = logging.getLogger("reflact")

CHAT_URL = "/v1/chat/completions"
ENDED = ("completed", "expired", "cancelled", "failed")  # a batch's statuses that no longer change


class NoBatchApi(Exception):
    """The server has no Batch API (HTTP 404 on /v1/batches)."""


class BatchFault(Exception):
    """A Batch API call that still failed after the retries; the message is one line."""


@dataclass
class BatchApi:
    """The Batch API of one server (the SDK's sync client)."""

    sdk: Any
    retry: RetryConfig
    secret: str = ""

    @property
    def url(self) -> str:
        return str(self.sdk.base_url)

    def probe(self) -> None:
        """Raises NoBatchApi when the server serves no /v1/batches (asked before anything is uploaded)."""
        try:
            self._call("look for /v1/batches", lambda: self.sdk.batches.list(limit=1), no_api_on_404=True)
        except NoBatchApi:
            raise
        except BatchFault:  # any other answer: the upload and the batch meet it again, with its cause
            return

    def upload(self, path: Path) -> str:
        """The file's id once uploaded with purpose "batch"."""
        with open(path, "rb") as handle:
            created = self._call(
                f"upload {path.name}", lambda: self.sdk.files.create(file=handle, purpose="batch"), no_api_on_404=True
            )
        return str(created.id)

    def create(self, file_id: str, metadata: dict[str, str]) -> dict:
        """A new batch of the uploaded file's requests, answered within 24 h."""
        created = self._call(
            "create a batch",
            lambda: self.sdk.batches.create(
                input_file_id=file_id, endpoint=CHAT_URL, completion_window="24h", metadata=metadata
            ),
            no_api_on_404=True,
        )
        return as_dict(created)

    def retrieve(self, batch_id: str) -> dict:
        return self._batch(f"look at batch {batch_id}", lambda: self.sdk.batches.retrieve(batch_id))

    def cancel(self, batch_id: str) -> dict:
        return self._batch(f"cancel batch {batch_id}", lambda: self.sdk.batches.cancel(batch_id))

    def find(self, file_id: str, since: float) -> dict | None:
        """The batch made of `file_id` no earlier than `since` (epoch seconds, a minute's slack), if
        any: one created by a command killed before it could note the batch's id."""
        page = self._call("list batches", lambda: self.sdk.batches.list(limit=100))
        for batch in page:  # newest first; the SDK pages on
            found = as_dict(batch)
            if found.get("input_file_id") == file_id:
                return found
            if (found.get("created_at") or 0) < since - 60:
                return None
        return None

    def content(self, file_id: str) -> bytes:
        """A file's bytes (a batch's output or errors)."""
        return bytes(self._call(f"read file {file_id}", lambda: self.sdk.files.content(file_id)).content)

    def _batch(self, what: str, call) -> dict:
        return as_dict(self._call(what, call))

    def _call(self, what: str, call, no_api_on_404: bool = False):
        retrying = Retrying(
            retry=retry_if_exception(is_transient),
            stop=stop_after_attempt(self.retry.max_attempts) | stop_before_delay(self.retry.max_seconds),
            wait=wait_after(self.retry.initial_wait_s, self.retry.max_wait_s),
            before_sleep=lambda state: log.info(
                "batch: %s: attempt %d/%d after %s",
                what,
                state.attempt_number + 1,
                self.retry.max_attempts,
                short_cause(state.outcome.exception() if state.outcome else None, self.secret),
            ),
            reraise=True,
        )
        try:
            return retrying(call)
        except openai.NotFoundError as exc:
            if no_api_on_404:
                raise NoBatchApi(describe_error(exc, self.secret)) from None
            raise BatchFault(f"could not {what}: {describe_error(exc, self.secret)}") from None
        except (openai.OpenAIError, TimeoutError) as exc:
            raise BatchFault(f"could not {what}: {describe_error(exc, self.secret)}") from None


def as_dict(obj: object) -> dict:
    """The SDK's object as plain JSON data (it builds objects without checking them)."""
    dumped = obj.model_dump(mode="json") if hasattr(obj, "model_dump") else obj
    return dumped if isinstance(dumped, dict) else {}


def make_batch_api(cfg: OptimizerConfig, environ: Mapping[str, str] | None = None) -> BatchApi:
    """The Batch API of the server `optimizer.*` names, with the key from the environment."""
    key = api_key(cfg, os.environ if environ is None else environ)
    common: dict[str, Any] = {"api_key": key or "not-needed", "timeout": cfg.timeout_s, "max_retries": 0}
    if cfg.provider is Provider.azure:
        sdk: Any = openai.AzureOpenAI(
            azure_endpoint=cfg.azure.endpoint,  # type: ignore[arg-type]  # None: the SDK reads AZURE_OPENAI_ENDPOINT
            api_version=cfg.azure.api_version,
            **common,
        )
    else:
        sdk = openai.OpenAI(base_url=cfg.base_url, **common)
    return BatchApi(sdk, cfg.retry, key)


# ---------------------------------------------------------------------------------------------- lines


def input_line(custom_id: str, body: dict) -> str:
    """One request of an input file."""
    line = {"custom_id": custom_id, "method": "POST", "url": CHAT_URL, "body": body}
    return json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n"


def read_lines(content: bytes) -> tuple[list[dict], int]:
    """(the JSON objects of a JSONL file, how many lines were not one: cut off or damaged)."""
    objects, damaged = [], 0
    for raw in content.splitlines():
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except (ValueError, RecursionError):
            damaged += 1
            continue
        if isinstance(line, dict):
            objects.append(line)
        else:
            damaged += 1
    return objects, damaged


@dataclass
class LineResult:
    """What one output or error line says of its request."""

    custom_id: str
    completion: Completion | None  # the reply, for a 2xx line whose body is a chat completion
    error: str = ""  # else why not, in one line
    retryable: bool = True  # whether another batch may answer it (expired, cancelled, 5xx, 429...)


def line_result(line: dict, warn) -> LineResult | None:
    """A line read: None when it names no request (no string custom_id)."""
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return None
    given = line.get("response")
    response: dict = given if isinstance(given, dict) else {}
    status = response.get("status_code")
    if isinstance(status, int) and 200 <= status < 300:
        try:
            return LineResult(custom_id, read_completion(json.dumps(response.get("body")).encode(), warn))
        except MalformedReply as exc:
            return LineResult(custom_id, None, str(exc))
    return failed_line(custom_id, status, response.get("body"), line.get("error"))


def failed_line(custom_id: str, status: object, body: object, error: object) -> LineResult:
    """A line without a reply: a 4xx (but 408, 409, 429) is the request's own and is not sent
    again; anything else (expired, cancelled, 5xx, no status) another batch may answer."""
    said = _said(body) or _said({"error": error})
    if isinstance(status, int) and 400 <= status < 500 and status not in (408, 409, 429):
        return LineResult(custom_id, None, f"HTTP {status}: {said or 'no message'}", retryable=False)
    code = error.get("code") if isinstance(error, dict) else None
    why = f"HTTP {status}" if isinstance(status, int) else str(code or "no reply")
    return LineResult(custom_id, None, f"{why}: {said}" if said and said != why else why, retryable=True)


def _said(body: object) -> str:
    """The message an error body carries, in one line."""
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else error if isinstance(error, str) else None
    return " ".join(str(message).split())[:300] if message else ""
