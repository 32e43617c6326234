"""A stand-in optimizer for tests and offline try-outs: a small OpenAI-compatible chat server.

    python -m reflact.testing.optimizer_server [--port N] [--latency S]   # prints its URL, serves until stopped

It listens on 127.0.0.1 only and answers every call with a valid but meaningless reply, so the
whole pipeline (prompts, parsing, patches, MLflow, sweeps) can be tried without a key or a model.
reflact never starts it or points at it on its own: a run reaches it only through an
`optimizer.base_url` naming it. Standard library only.

By default it answers every call with a valid reply for the mode it reads off the user
message, proposing L + 2 items so the budget cut shows. Tests inject faults by setting
`script`: a function (request body, call number) -> Response, or None for the default.

A request that carries a `seed` (reflact sends one with optimizer.samples > 1) is answered like a
sampling model: the same minibatch gets partly different items for different seeds, and all of
it is a function of the minibatch's ids and the seed (see `seeded_items`). With the provenance
instruction in the system prompt every item names the trajectories it stands on.

It also serves the Batch API (`/v1/files`, `/v1/batches`: reflact.testing.batch_server), with
settings for its faults (`OptimizerServer(batches=BatchSettings(...))`, `--batch-delay`), answers a
flex request's first `flex_busy` tries with 429 "resource unavailable", names the tier that served
each reply, and counts what was sent at `GET /stats`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from reflact.testing.batch_server import BatchService, BatchSettings, digest


@dataclass
class Response:
    status: int = 200
    body: object = None  # dict -> JSON; str -> sent as is (UTF-8); bytes -> sent as is
    headers: dict = field(default_factory=dict)
    delay_s: float = 0.0
    # > 0: after the headers, the body goes one byte at a time, this many seconds apart (a server
    # that keeps a connection alive without ever finishing)
    trickle_s: float = 0.0
    trickle_headers: bool = False  # with trickle_s: the status line and headers trickle too


def chat_body(text: str, finish_reason: str = "stop", prompt_tokens: int = 100, completion_tokens: int = 50) -> dict:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "test-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish_reason}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": 20},
            "completion_tokens_details": {"reasoning_tokens": 10},
        },
    }


def embedding_body(vectors: list, prompt_tokens: object = 8) -> dict:
    """An /embeddings reply carrying `vectors` in order (the server itself has none: tests script
    them, see OptimizerServer.script; `request["input"]` holds the texts)."""
    return {
        "object": "list",
        "model": "test-embedding",
        "data": [{"object": "embedding", "index": i, "embedding": vector} for i, vector in enumerate(vectors)],
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


# rules a seeded reply proposes: a minibatch's "stable" items come from here (the same in every draw,
# and now and then the same as another minibatch's), its draw-dependent items from RARE
RULES = (
    "Check the final answer against the exact wording of the question before finishing.",
    "Search for the full name of an entity before searching for its attributes.",
    "When a lookup returns nothing, retry once with a shorter query before giving up.",
    "Quote the passage that supports the answer in your reasoning.",
    "Compare both candidates explicitly when the question asks which of two is larger.",
    "Stop searching once two independent sources agree.",
    "Convert amounts to the units the task uses before acting on them.",
    "Prefer the most specific page over a disambiguation page.",
    "Keep the answer to the shortest span that fully answers the question.",
    "Re-read the task's constraints after every tool error.",
    "Write down intermediate findings before starting a new search.",
    "Verify the current state of a record before changing it.",
    "State which rule applies when you refuse a request.",
    "Double-check dates and years against the source text.",
    "Never repeat a failed action with identical arguments.",
    "Ask for the missing identifier instead of guessing it.",
)
RARE = (
    "Mention delivery times only when the user asks about them.",
    "Greet the user by name when the profile gives one.",
    "Summarise long tool outputs in one sentence before using them.",
    "Use a table when the answer lists more than three items.",
    "Close every conversation by asking whether anything else is needed.",
    "Spell out abbreviations the first time they appear.",
    "Prefer official sources over forum posts.",
    "Round percentages to one decimal place.",
    "Log the tool name with each observation you cite.",
    "Avoid nested bullet points deeper than two levels.",
    "Translate foreign titles before comparing them.",
    "Sort candidate answers alphabetically before choosing.",
    "Treat a timeout as a failed lookup, not as an empty result.",
    "Say explicitly when two sources conflict.",
    "Restate the user's goal in your first message.",
    "Keep replies under one hundred words unless asked for detail.",
    "Write numbers below ten as words.",
    "Link the source page beside each cited fact.",
    "Use the customer's currency in every amount you mention.",
    "Confirm irreversible actions before taking them.",
    "Name the assumption behind any estimate you give.",
    "Cite the step number when you refer to an earlier action.",
    "Start each search with the most distinctive word of the question.",
    "Report the tool's error message word for word.",
)


# RULES in other words, as another draw of a real model would put them (OptimizerServer(reword=True))
REWORDED = (
    "Before you finish, make sure your answer responds to precisely what the question asked.",
    "Look up an entity's complete name first, and only then query its properties.",
    "If a search comes back empty, make one more attempt using fewer words before stopping.",
    "Cite the exact sentence from the source that backs your answer while you reason.",
    "If the question asks which of two things is bigger, set the two side by side and compare them.",
    "End the search as soon as two separate sources give the same answer.",
    "Express every quantity in the task's own units before doing anything with it.",
    "Choose the most precise article rather than a page listing several meanings.",
    "Answer with the briefest phrase that still covers everything the question asks.",
    "Whenever a tool call fails, go back over the requirements of the task.",
    "Note what you have found so far before you begin another lookup.",
    "Look at how a record stands right now before you modify it.",
    "When you decline a request, say which policy is the reason.",
    "Compare every year and date you give with the source to be sure it is right.",
    "Don't retry a failed call with exactly the same parameters.",
    "When an id is needed but not given, request it from the user rather than making one up.",
)


def judge_reply(request: dict) -> dict | None:
    """A deterministic judge (reflact.analysis.judge): two changes are the same when both are RULES[i] or
    its REWORDED form, in any case and with or without the leading "- "; None for other requests."""
    if "## Same-change judge" not in str((request.get("messages") or [{}])[0].get("content")):
        return None
    known = {_plain(text): i for i, text in (*enumerate(RULES), *enumerate(REWORDED))}
    pairs = re.findall(r"^A: (.*)\nB: (.*)$", request["messages"][1]["content"], re.M)
    same = [known.get(_plain(a), -1) == known.get(_plain(b), -2) for a, b in pairs]
    return chat_body(json.dumps({"same": same}))


def _plain(text: str) -> str:
    return text.lower().removeprefix("- ").rstrip(".").strip()


def _number(text: str) -> int:
    """A stable number from text (Python's hash() differs between processes)."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def seeded_items(ids: list[str], n: int, seed: int, reword: bool = False) -> list[str]:
    """n rule texts for a minibatch and a seed: item i is the minibatch's own rule (RULES, the same
    whatever the seed; for odd seeds lightly reworded: lower case, no final stop) unless
    (i + seed) % 3 == 2, when it is a rule of this draw alone (RARE). With `reword`, every item is
    the minibatch's own rule, in other words (REWORDED) for odd seeds."""
    base = _number(",".join(ids))
    texts = []
    for i in range(n):
        if reword:
            texts.append((REWORDED if seed % 2 else RULES)[(base + i) % len(RULES)])
            continue
        if (i + seed) % 3 == 2:
            texts.append(RARE[_number(f"{base}/{i}/{seed}") % len(RARE)])
            continue
        rule = RULES[(base + i) % len(RULES)]
        texts.append(rule[0].lower() + rule[1:-1] if seed % 2 else rule)
    return texts


def _first_rule_line(user: str) -> str | None:
    """A line of the current skill to anchor insert_after edits on (its first bullet)."""
    after = user.split("## Current Skill\n", 1)[-1]
    skill = re.split(r"\n\n## (?:Edit Budget|Suggestion Budget|Update Format)\n", after)[0]
    return next((line for line in skill.splitlines() if line.startswith("- ")), None)


def _items(user: str, ids: list[str], n: int, seed: int | None, reword: bool = False) -> dict:
    if "## Update Format" in user:
        summary = ["tightened rules"] if seed is None else seeded_items(ids, 2, seed, reword)
        return {
            "reasoning": "one candidate",
            "skill_candidates": [
                {"title": "Rewrite", "change_summary": summary, "new_skill": "# Skill\n- be careful\n"}
            ],
        }
    if "## Suggestion Budget" in user:
        texts = [None] * n if seed is None else seeded_items(ids, n, seed, reword)
        return {
            "reasoning": "suggestions",
            "revise_suggestions": [
                {
                    "type": "clarify",
                    "title": f"s{i}" if text is None else text[:40],
                    "motivation": "seen often",
                    "instruction": "say it plainly" if text is None else text,
                    "priority_hint": "high",
                }
                for i, text in enumerate(texts)
            ],
        }
    if seed is None:
        return {
            "reasoning": "edits",
            "edits": [{"op": "append", "content": f"- rule {i} from {', '.join(ids)}"} for i in range(n)],
        }
    anchor = _first_rule_line(user)
    edits = [
        {"op": "insert_after", "target": anchor, "content": f"- {text}"}
        if anchor and i % 2
        else {"op": "append", "content": f"- {text}"}
        for i, text in enumerate(seeded_items(ids, n, seed, reword))
    ]
    return {"reasoning": "edits", "edits": edits}


def default_reply(request: dict, reword: bool = False) -> dict:
    """A valid reply object for the request's mode and group, with L + 2 items."""
    user = request["messages"][1]["content"]
    group_failure = "## Failed Trajectories" in user
    budget = re.search(r"at most L=(\d+)", user)
    n = int(budget.group(1)) + 2 if budget else 3
    ids = re.findall(r"^### Trajectory \d+ of \d+ \(id: (.+)\)$", user, re.M)
    patch = _items(user, ids, n, request.get("seed"), reword)
    if "## Evidence Behind Each Item" in request["messages"][0]["content"]:
        for i, item in enumerate(next(v for k, v in patch.items() if k != "reasoning")):
            # the first item stands on no trajectory; the others on one or two
            named = {1 + i % len(ids), 1 + (i * 3) % len(ids)} if ids else set()
            item["supporting_trajectories"] = [] if i == 0 else sorted(named)
    summary_key = "failure_summary" if group_failure else "success_patterns"
    summary: dict[str, Any] = {"pattern": "p", "trajectories": ids}
    if group_failure:  # as the failure templates ask for it
        summary = {
            "failure_type": "p",
            "count": len(ids),
            "trajectories": ids,
            "description": f"the agent got the amount wrong in {len(ids)} run(s)",
        }
    reply = {summary_key: [summary], "patch": patch}
    if "## Skill-Aware Reflection" in request["messages"][0]["content"]:
        reply["appendix_notes"] = ["Follow the verification rule.", {"note": "Check units."}, ""]
    return reply


def response_bytes(body: object) -> bytes:
    if isinstance(body, bytes):
        return body
    return (body if isinstance(body, str) else json.dumps(body)).encode("utf-8")


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # many workers connect at once; the default backlog of 5 drops some
    owner: OptimizerServer


NOT_FOUND = Response(status=404, body={"error": {"message": "Not Found"}})  # like many servers


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    def do_GET(self) -> None:
        """/stats: what was sent (chat requests, batch lines, requests sent twice); the Batch API's reads."""
        owner, path = self.server.owner, self.path.split("?")[0].rstrip("/")
        if path.endswith("/stats"):
            self._reply(Response(body=owner.batches.stats(owner.count)))
        elif not owner.batches.settings.enabled:
            self._reply(NOT_FOUND)
        elif path.endswith("/content") and "/files/" in path:
            status, data = owner.batches.files.content(path.split("/files/")[1].split("/")[0])
            self._reply(Response(status=status, body=data))
        elif path.endswith("/batches"):
            self._reply(Response(body=owner.batches.listed()))
        elif "/batches/" in path:
            self._reply(Response(*owner.batches.retrieve(path.rsplit("/", 1)[1])))
        else:
            self._reply(NOT_FOUND)

    def do_POST(self) -> None:
        owner, path = self.server.owner, self.path.split("?")[0].rstrip("/")
        length = int(self.headers.get("Content-Length", 0))
        raw = self.rfile.read(length)
        if path.endswith(("/files", "/batches", "/cancel")):
            self._batch_api(path, raw)
            return
        request = json.loads(raw or b"{}")
        number = owner.record(request, self.headers.get("Authorization"))
        response = NOT_FOUND if path.endswith("/embeddings") and not owner.script else owner.answer(request, number)
        if response.delay_s:
            time.sleep(response.delay_s)
        try:
            self._reply(response)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test)

    def _batch_api(self, path: str, raw: bytes) -> None:
        batches = self.server.owner.batches
        if not batches.settings.enabled:
            self._reply(NOT_FOUND)
        elif path.endswith("/files"):
            self._reply(Response(*batches.files.upload(self.headers.get("Content-Type", ""), raw)))
        elif path.endswith("/cancel"):
            self._reply(Response(*batches.cancel(path.rsplit("/", 2)[1])))
        else:
            self._reply(Response(*batches.create(json.loads(raw or b"{}"))))

    def _reply(self, response: Response) -> None:
        data = response_bytes(response.body)
        self.send_response(response.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in response.headers.items():
            self.send_header(key, value)
        if response.trickle_s and response.trickle_headers:
            # the handler buffers the status line and headers until end_headers: send them slowly
            head, self._headers_buffer = b"".join(self._headers_buffer) + b"\r\n", []  # type: ignore[has-type,var-annotated]  # private in http.server, untyped
            self._trickle(head + data, response.trickle_s)
        elif response.trickle_s:
            self.end_headers()
            self._trickle(data, response.trickle_s)
        else:
            self.end_headers()
            self.wfile.write(data)

    def _trickle(self, data: bytes, seconds: float) -> None:
        for i in range(len(data)):
            self.wfile.write(data[i : i + 1])
            time.sleep(seconds)


class OptimizerServer:
    def __init__(self, script=None, port: int = 0, reword: bool = False, batches: BatchSettings | None = None) -> None:
        self.script = script
        self.reword = reword  # seeded draws word the same rules differently (seeded_items)
        # the Batch API (reflact.testing.batch_server): its settings, files and batches
        self.batches = BatchService(self.answer, batches or BatchSettings())
        self._busy: dict[str, int] = {}  # flex 429s answered, by request
        self.requests: list[dict] = []
        self.authorizations: list[str | None] = []  # each request's Authorization header, in order
        self._lock = threading.Lock()
        # loopback only, whatever the port: this server is never meant to be reached from elsewhere
        self._httpd = _Server(("127.0.0.1", port), _Handler)
        self._httpd.owner = self
        self._httpd.daemon_threads = True
        # a short poll: shutdown() waits for the serving loop to look, and tests start and stop many servers
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def record(self, request: dict, authorization: str | None) -> int:
        """Keep a request and its Authorization header; its number, from 1."""
        with self._lock:
            self.requests.append(request)
            self.authorizations.append(authorization)
            return len(self.requests)

    def answer(self, request: dict, number: int) -> Response:
        """A chat request's answer: the script's, else the judge's or the default reply; a flex
        request gets `batches.flex_busy` 429s "resource unavailable" first. A completion names the
        tier that served it (`service_tier`)."""
        tier = request.get("service_tier") or "default"
        if tier == "flex" and self._flex_busy(request):
            error = {"message": "Resource unavailable: try again later", "code": "resource_unavailable"}
            return Response(status=429, body={"error": {**error, "type": "server_error"}})
        with self._lock:  # what /stats counts as sent: each request answered, a chat request or a batch's line
            self.batches.sent[digest(request)] += 1
        response = (self.script(request, number) if self.script else None) or Response(
            body=judge_reply(request) or chat_body(json.dumps(default_reply(request, self.reword)))
        )
        if isinstance(response.body, dict) and "choices" in response.body:
            response.body.setdefault("service_tier", tier)
        return response

    def _flex_busy(self, request: dict) -> bool:
        with self._lock:
            seen = self._busy.get(digest(request), 0)
            self._busy[digest(request)] = seen + 1
            return seen < self.batches.settings.flex_busy

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def __enter__(self) -> OptimizerServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.requests)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m reflact.testing.optimizer_server",
        description="A stand-in OpenAI-compatible optimizer on 127.0.0.1, for tests and offline try-outs: "
        "every call gets a valid, meaningless reply. Prints its base URL on the first line, "
        "then serves until interrupted.",
    )
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any free one)")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds to wait before each reply (default: 0)")
    parser.add_argument(
        "--batch-delay", type=float, default=0.0, help="seconds a batch takes once created (default: 0)"
    )
    args = parser.parse_args(argv)
    if args.latency < 0 or args.batch_delay < 0 or not 0 <= args.port <= 65535:
        parser.error("--latency and --batch-delay must be >= 0 and --port within 0..65535")
    return args


def main(argv: list[str] | None = None) -> None:
    args = _arguments(argv)

    def script(request: dict, number: int) -> Response:
        server.requests[number - 1] = {}  # a long-running server keeps no request bodies
        return Response(body=chat_body(json.dumps(default_reply(request))), delay_s=args.latency)

    try:
        server = OptimizerServer(script, port=args.port, batches=BatchSettings(delay_s=args.batch_delay))
    except OSError as error:  # the port is taken
        print(f"optimizer_server: error: cannot listen on 127.0.0.1:{args.port}: {error.strerror}", file=sys.stderr)
        raise SystemExit(2) from None
    with server:
        print(server.base_url, flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
