"""An on-disk response cache (sqlite), so an identical rerun or sweep cell costs no call.

The key covers everything that shapes a reply: the endpoint (the base URL; for Azure also the
deployment and API version), the model, the full messages, every decoding parameter, the
structured-output setting and schema, and the sample index. Several processes of a sweep
may share the file; sqlite's own locking keeps it whole.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from pathlib import Path

from reflact.config import CacheMode


def cache_key(request: dict) -> str:
    return hashlib.sha256(json.dumps(request, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


class ResponseCache:
    def __init__(self, path: Path, mode: CacheMode) -> None:
        self.path = path
        self.readable = mode in (CacheMode.read_write, CacheMode.read)
        self.writable = mode in (CacheMode.read_write, CacheMode.write)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._closed = False  # closed while workers may still finish: then it neither answers nor keeps
        self._db = sqlite3.connect(path, timeout=60, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS replies (key TEXT PRIMARY KEY, reply TEXT NOT NULL)")

    def get(self, key: str) -> dict | None:
        if not self.readable:
            return None
        with self._lock:
            if self._closed:
                return None
            row = self._db.execute("SELECT reply FROM replies WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def put(self, key: str, reply: dict) -> None:
        if not self.writable:
            return
        with self._lock:
            if self._closed:
                return
            self._db.execute("INSERT OR REPLACE INTO replies (key, reply) VALUES (?, ?)", (key, json.dumps(reply)))

    def forget(self, keys: list[str]) -> None:
        """Drop replies that led nowhere, so a rerun asks again instead of replaying a failure."""
        with self._lock:
            if self._closed:
                return
            self._db.executemany("DELETE FROM replies WHERE key = ?", [(k,) for k in keys])

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._db.close()
