"""The stand-in optimizer's Batch API (`reflact.testing.optimizer_server`): `/v1/files` (upload,
content) and `/v1/batches` (create, retrieve, list, cancel), with settings for the faults a real
one has (`BatchSettings`). Standard library only.

A batch answers each line as the server answers a chat request (its `script`, else its default
reply) once `delay_s` has passed since its creation; it is then `completed`, or `expired` with
only a share of its lines done (the rest in its error file as `batch_expired`). Time passes only
when someone looks: a batch moves on as it is retrieved.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from email.parser import BytesParser
from email.policy import default as default_policy
from typing import Any


@dataclass
class BatchSettings:
    enabled: bool = True  # False: 404 on /v1/files and /v1/batches, as a plain OpenAI-compatible server
    delay_s: float = 0.0  # a batch is done this long after its creation
    expire_share: float | None = None  # a batch expires with only this share of its lines done
    expire_batches: int = 1  # how many batches (the first ones) expire so
    fail_validation: bool = False  # every batch fails validation, naming its first two lines
    poll_errors: int = 0  # the next N looks at a batch answer HTTP 500
    upload_errors: int = 0  # the next N uploads answer HTTP 500
    output_missing: bool = False  # an output file's content answers 404
    output_cut: bool = False  # an output file's content ends in the middle of a line
    output_extra: list[str] = field(default_factory=list)  # lines added to every output file
    output_doubled: bool = False  # an output file answers its first request twice, the second time otherwise
    flex_busy: int = 0  # each flex request's first N answers are 429 "resource unavailable"


def new_batch(batch_id: str, request: dict, lines: list[dict], number: int) -> dict:
    """A batch object as the API shows it (and, under `_`, what the stand-in keeps of it)."""
    now = int(time.time())
    return {
        "id": batch_id,
        "object": "batch",
        "endpoint": request.get("endpoint"),
        "input_file_id": request["input_file_id"],
        "completion_window": "24h",
        "status": "in_progress",
        "created_at": now,
        "in_progress_at": now,
        "expires_at": now + 86400,
        "metadata": request.get("metadata"),
        "output_file_id": None,
        "error_file_id": None,
        "request_counts": {"total": len(lines), "completed": 0, "failed": 0},
        "errors": None,
        "usage": None,
        "_lines": lines,
        "_number": number,
    }


def digest(request: dict) -> str:
    """A request as the stats count it: its body, whatever tier it asked for."""
    body = {key: value for key, value in request.items() if key != "service_tier"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode("utf-8")).hexdigest()


class Files:
    """The stand-in's `/v1/files`: uploads, and the files its batches write."""

    def __init__(self, settings: BatchSettings) -> None:
        self.settings = settings
        self.files: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def upload(self, content_type: str, body: bytes) -> tuple[int, dict]:
        if self.settings.upload_errors:
            self.settings.upload_errors -= 1
            return 500, {"error": {"message": "the upload was interrupted"}}
        message = BytesParser(policy=default_policy).parsebytes(f"Content-Type: {content_type}\r\n\r\n".encode() + body)
        parts = {part.get_param("name", header="content-disposition"): part for part in message.iter_parts()}
        data = parts["file"].get_payload(decode=True) if "file" in parts else b""
        return 200, self._file(bytes(data), str(parts["file"].get_filename() or "input.jsonl"), "batch")

    def _file(self, data: bytes, name: str, purpose: str) -> dict:
        with self._lock:
            file_id = f"file-{len(self.files) + 1}"
            self.files[file_id] = data
        return {
            "id": file_id,
            "object": "file",
            "bytes": len(data),
            "filename": name,
            "purpose": purpose,
            "created_at": int(time.time()),
            "status": "processed",
        }

    def content(self, file_id: str) -> tuple[int, bytes]:
        data = self.files.get(file_id)
        if data is None or (self.settings.output_missing and file_id.endswith("-output")):
            return 404, json.dumps({"error": {"message": f"no file {file_id}"}}).encode()
        return 200, data

    def keep(self, batch_id: str, kind: str, lines: list[dict], extra: list[str] | None = None) -> str | None:
        """A batch's output or error file; its id (None when it has no line)."""
        if not lines and not extra:
            return None
        text = "".join(json.dumps(line) + "\n" for line in lines) + "".join(line + "\n" for line in extra or [])
        data = text.encode("utf-8")
        if kind == "output" and self.settings.output_cut:
            data = data[: max(len(data) - 40, 0)]
        file_id = f"file-{batch_id}-{kind}"
        self.files[file_id] = data
        return file_id


class BatchService:
    """Files and batches of one stand-in server; `answer(request, number)` answers a line."""

    def __init__(self, answer, settings: BatchSettings) -> None:
        self.answer = answer
        self.settings = settings
        self.files = Files(settings)
        self.batches: dict[str, dict] = {}
        self.lines: list[dict] = []  # every line's body the batches ran, in order
        self.sent: Counter[str] = Counter()  # requests by digest: chat requests and batch lines
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ batches

    def create(self, request: dict) -> tuple[int, dict]:
        data = self.files.files.get(str(request.get("input_file_id")))
        if data is None:
            return 400, {"error": {"message": "no such input file"}}
        with self._lock:
            batch_id = f"batch_{len(self.batches) + 1:04d}"
            lines = [json.loads(line) for line in data.splitlines() if line.strip()]
            self.batches[batch_id] = new_batch(batch_id, request, lines, len(self.batches) + 1)
        return 200, self.shown(batch_id)

    def retrieve(self, batch_id: str) -> tuple[int, dict]:
        if batch_id not in self.batches:
            return 404, {"error": {"message": f"no batch {batch_id}"}}
        if self.settings.poll_errors:
            self.settings.poll_errors -= 1
            return 500, {"error": {"message": "the server is busy"}}
        self._move_on(batch_id)
        return 200, self.shown(batch_id)

    def cancel(self, batch_id: str) -> tuple[int, dict]:
        batch = self.batches.get(batch_id)
        if batch is None:
            return 404, {"error": {"message": f"no batch {batch_id}"}}
        if batch["status"] in ("in_progress", "validating"):
            batch["status"], batch["cancelling_at"] = "cancelling", int(time.time())
        return 200, self.shown(batch_id)

    def listed(self) -> dict:
        data = [self.shown(batch_id) for batch_id in sorted(self.batches, reverse=True)]
        return {"object": "list", "data": data, "has_more": False, "first_id": None, "last_id": None}

    def shown(self, batch_id: str) -> dict:
        return {k: v for k, v in self.batches[batch_id].items() if not k.startswith("_")}

    def _move_on(self, batch_id: str) -> None:
        batch = self.batches[batch_id]
        if batch["status"] == "cancelling":
            self._finish(batch, "cancelled", done=0)
        elif batch["status"] == "in_progress" and time.time() >= batch["created_at"] + self.settings.delay_s:
            if self.settings.fail_validation:
                batch["status"], batch["failed_at"] = "failed", int(time.time())
                batch["errors"] = {
                    "object": "list",
                    "data": [
                        {"code": "invalid_request", "message": "the body is not valid", "line": line, "param": "body"}
                        for line in (1, 2)
                    ],
                }
                return
            expiring = self.settings.expire_share is not None and batch["_number"] <= self.settings.expire_batches
            share = self.settings.expire_share if expiring and self.settings.expire_share is not None else 1.0
            self._finish(batch, "expired" if expiring else "completed", math.floor(share * len(batch["_lines"])))

    def _finish(self, batch: dict, status: str, done: int) -> None:
        """Answers the first `done` lines; the others go to the error file as not run."""
        output: list[dict] = []
        errors: list[dict] = []
        usage = Counter[str]()
        code = "batch_expired" if status == "expired" else "batch_cancelled"
        for n, line in enumerate(batch["_lines"]):
            if n >= done:
                errors.append(_not_run(n, line["custom_id"], code, status))
                continue
            self.lines.append(line["body"])
            response = self.answer(line["body"], len(self.lines))
            body = response.body if isinstance(response.body, dict) else {"error": {"message": str(response.body)}}
            usage.update({k: v for k, v in (body.get("usage") or {}).items() if isinstance(v, int)})
            result = {
                "id": f"req_{n}",
                "custom_id": line["custom_id"],
                "response": {"status_code": response.status, "request_id": f"r{n}", "body": body},
                "error": None,
            }
            (output if response.status == 200 else errors).append(result)
        if self.settings.output_doubled and output:
            output.append(_doubled(output[0]))
        batch["output_file_id"] = self.files.keep(batch["id"], "output", output, extra=self.settings.output_extra)
        batch["error_file_id"] = self.files.keep(batch["id"], "errors", errors)
        failed = len(errors)
        completed = len({line["custom_id"] for line in output})
        batch["request_counts"] = {"total": len(batch["_lines"]), "completed": completed, "failed": failed}
        batch["usage"] = {
            "input_tokens": usage["prompt_tokens"],
            "output_tokens": usage["completion_tokens"],
            "total_tokens": usage["total_tokens"],
        }
        batch["status"], batch[f"{status}_at"] = status, int(time.time())

    def stats(self, chat: int) -> dict[str, Any]:
        """What was sent: chat requests, batch lines, and requests sent more than once."""
        return {
            "requests": chat,
            "batches": len(self.batches),
            "batch_lines": len(self.lines),
            "distinct": len(self.sent),
            "sent_twice": sum(1 for n in self.sent.values() if n > 1),
            "uploads": len([f for f in self.files.files if f.count("-") == 1]),
        }


def _doubled(line: dict) -> dict:
    """An output line answering its request a second time, otherwise."""
    again = json.loads(json.dumps(line))
    again["response"]["body"]["choices"][0]["message"]["content"] = "a second answer"
    return again


def _not_run(n: int, custom_id: str, code: str, status: str) -> dict:
    """An error line for a request the batch ended before running."""
    error = {"code": code, "message": f"this request was not run: {status}"}
    return {"id": f"req_{n}", "custom_id": custom_id, "response": None, "error": error}
