"""The benchmarks' optimizer: the tests' loopback server with a fixed latency, run as its own process.

    python bench/_server.py --delay 0.5      # prints its base_url, serves until terminated

It answers every chat request with the tests' default reply (valid for any mode) after `--delay`
seconds, and records per request the characters of its messages and its arrival time. A POST
with the body {"bench": "stats"} returns those records; {"bench": "reset"} clears them. Being a
separate process, it does not compete for the measured process's GIL.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reflact.testing.optimizer_server import OptimizerServer, Response, chat_body, default_reply  # noqa: E402


def message_chars(request: dict) -> int:
    total = 0
    for message in request.get("messages") or []:
        content = message.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):  # content parts
            total += sum(len(part.get("text") or "") for part in content if isinstance(part, dict))
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay", type=float, default=0.5, help="seconds before each reply")
    args = parser.parse_args()

    # socketserver listens with a backlog of 5: more simultaneous connects than that overflow the
    # accept queue, and the dropped SYNs are retried by the kernel after 1 s, which would show up
    # as a 1 s stall of a few calls. The benchmarks measure the client, not that.
    from http.server import ThreadingHTTPServer

    ThreadingHTTPServer.request_queue_size = 1024

    lock = threading.Lock()
    records: list[tuple[float, int]] = []  # (arrival, message chars) per chat request
    server: OptimizerServer | None = None

    def script(request: dict, number: int) -> Response:
        command = request.get("bench")
        if command == "stats":
            with lock:
                chars = [c for _, c in records]
                arrivals = [t for t, _ in records]
            body = {"requests": len(chars), "chars": chars, "arrivals": arrivals}
            return Response(body=body)
        if command == "reset":
            with lock:
                records.clear()
            return Response(body={"ok": True})
        with lock:
            records.append((time.time(), message_chars(request)))
        server.requests[number - 1] = {}  # keep the server's own log of bodies from growing
        return Response(body=chat_body(json.dumps(default_reply(request))), delay_s=args.delay)

    server = OptimizerServer(script)
    with server:
        print(server.base_url, flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
