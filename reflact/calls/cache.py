"""An on-disk response cache (sqlite), so an identical rerun or sweep cell costs no call.

The key covers everything that shapes a reply: the endpoint (the base URL; for Azure also the
deployment and API version), the model, the full messages, every decoding parameter, the
structured-output setting and schema, and the sample index. Several processes of a sweep
may share the file; sqlite's own locking keeps it whole.

The cache is an optimisation, never a reason to stop or to lose a paid reply: a file that cannot
be opened (a folder, not a database), a write that finds the file locked past `timeout_s`, any
database error later, and the run goes on without a cache after one warning. An entry that does
not read back (as a JSON object; for the client, as a reply: `cached_reply`) is a miss.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import threading
import time
from dataclasses import asdict, fields
from pathlib import Path

from reflact.calls.protocol import Reply, Usage
from reflact.config import CacheMode
from reflact.core.files import repair_text

log = logging.getLogger("reflact")
_USAGE = {f.name for f in fields(Usage)}


def cache_key(request: dict) -> str:
    return hashlib.sha256(json.dumps(request, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def _entry(row: tuple | None) -> dict | None:
    """A stored JSON object, or None (a miss) when there is none or it does not read back as one."""
    try:
        entry = json.loads(row[0]) if row else None
    except (TypeError, ValueError, RecursionError):
        return None
    return entry if isinstance(entry, dict) else None


def cache_entry(reply: Reply) -> dict:
    """What the cache keeps of a reply (cached_reply reads it back)."""
    entry = {
        "text": reply.text,
        "finish_reason": reply.finish_reason,
        "structured": reply.structured,
        "usage": asdict(reply.usage),
    }
    if reply.service_tier:  # what it cost when made: the price of the tier that served it
        entry["service_tier"] = reply.service_tier
    if reply.batch_id:  # a batch's line, paid by the batch; the first run to use it counts it as its call
        entry["batch"] = reply.batch_id
    return entry


def cached_reply(entry: dict | None, key: str) -> Reply | None:
    """A stored chat reply, free and started now; None (a miss) when the entry is not one. A batch's
    line names its batch (`batch_id`): on its first use (ResponseCache.claim) it is that run's call."""
    hit = _reply_entry(entry)
    if hit is None:
        return None
    return Reply(
        hit["text"],
        hit["finish_reason"],
        Usage(**hit.get("usage", {})),
        0.0,
        from_cache=True,
        structured=hit.get("structured", "off"),
        started_at=time.time(),
        cache_key=key,
        service_tier=hit.get("service_tier", ""),
        batch_id=hit.get("batch", ""),
    )


def used_reply(cache: ResponseCache, key: str) -> Reply | None:
    """The cache's reply to `key`, used: a batch's line on its first use is this request's call,
    paid by the batch (ResponseCache.claim); any other hit is free."""
    hit = cached_reply(cache.get(key), key)
    if hit is not None and hit.batch_id and cache.claim(key):
        hit.from_cache = False
    return hit


def _reply_entry(entry: dict | None) -> dict | None:
    """A stored chat reply as the client reads it, or None (a miss) when it is not one."""
    if entry is None or not isinstance(entry.get("text"), str):
        return None
    usage = entry.get("usage", {})
    if not (
        isinstance(entry.get("finish_reason"), (str, type(None)))
        and isinstance(entry.get("structured", "off"), str)
        and isinstance(entry.get("service_tier", ""), str)
        and isinstance(entry.get("batch", ""), str)
        and isinstance(usage, dict)
        and set(usage) <= _USAGE
        and all(type(count) is int and count >= 0 for count in usage.values())
    ):
        return None
    return {**entry, "text": repair_text(entry["text"])}  # an entry written before replies were repaired


class ResponseCache:
    def __init__(self, path: Path, mode: CacheMode, timeout_s: float = 60.0) -> None:
        self.path = path
        self.readable = mode in (CacheMode.read_write, CacheMode.read)
        self.writable = mode in (CacheMode.read_write, CacheMode.write)
        self._lock = threading.Lock()
        self._closed = False  # closed while workers may still finish: then it neither answers nor keeps
        self._db: sqlite3.Connection | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, timeout=timeout_s, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("CREATE TABLE IF NOT EXISTS replies (key TEXT PRIMARY KEY, reply TEXT NOT NULL)")
            # a batch's lines used by a run (the first use is that run's call, paid by the batch)
            self._db.execute("CREATE TABLE IF NOT EXISTS claims (key TEXT PRIMARY KEY)")
        except (sqlite3.Error, OSError) as exc:
            self._give_up(exc)

    def get(self, key: str) -> dict | None:
        if not self.readable:
            return None
        return _entry(self._run("SELECT reply FROM replies WHERE key = ?", [(key,)]))

    def put(self, key: str, reply: dict) -> None:
        if self.writable:
            self._run("INSERT OR REPLACE INTO replies (key, reply) VALUES (?, ?)", [(key, json.dumps(reply))])

    def forget(self, keys: list[str]) -> None:
        """Drop replies that led nowhere, so a rerun asks again instead of replaying a failure."""
        self._run("DELETE FROM replies WHERE key = ?", [(k,) for k in keys])
        self._run("DELETE FROM claims WHERE key = ?", [(k,) for k in keys])

    def put_batch(self, key: str, reply: dict) -> None:
        """A batch's line: kept, its next use a first use (reflact.running.batch collects into here)."""
        self.put(key, reply)
        self._run("DELETE FROM claims WHERE key = ?", [(key,)])

    def claim(self, key: str) -> bool:
        """Whether this is the first use of the entry `key` (a batch's line counts once, as a call)."""
        with self._lock:
            if self._closed or self._db is None or not self.writable:
                return False
            try:  # sqlite's own locking makes one process of a sweep's the first
                return self._db.execute("INSERT OR IGNORE INTO claims (key) VALUES (?)", (key,)).rowcount == 1
            except (sqlite3.Error, OSError) as exc:
                self._give_up(exc)
                return False

    def _run(self, sql: str, rows: list[tuple]) -> tuple | None:
        """The statement for each row (the first row's result back); None once the cache is off."""
        with self._lock:
            if self._closed or self._db is None:
                return None
            try:
                found = None
                for row in rows:
                    found = found or self._db.execute(sql, row).fetchone()
                return found
            except (sqlite3.Error, OSError) as exc:
                self._give_up(exc)
                return None

    def _give_up(self, exc: BaseException) -> None:
        """From now on no cache: one warning, the handle closed (called under the lock, or in __init__)."""
        log.warning("the response cache %s failed (%s); the run goes on without a cache", self.path, exc)
        self._closed = True
        if self._db is not None:
            try:
                self._db.close()
            except sqlite3.Error:
                pass  # a handle that will not close is dropped with the object

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._db is not None:
                self._db.close()
