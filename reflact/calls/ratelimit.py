"""Requests- and tokens-per-minute limits shared by all workers of a run.

Two token buckets refilled continuously; a worker waits until both have room, so a run
with many workers slows down instead of collecting 429s.
"""

from __future__ import annotations

import threading
import time


class Bucket:
    def __init__(self, per_minute: float) -> None:
        self.capacity = float(per_minute)
        self.level = float(per_minute)
        self.rate = per_minute / 60.0
        self.stamp = time.monotonic()

    def wait_for(self, amount: float) -> float:
        """Seconds until `amount` fits (0 when it fits now); takes it when it fits."""
        now = time.monotonic()
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now
        amount = min(amount, self.capacity)  # one request larger than a minute's allowance still goes, alone
        if self.level >= amount:
            self.level -= amount
            return 0.0
        return (amount - self.level) / self.rate


class RateLimiter:
    def __init__(self, rpm: int | None, tpm: int | None, stop: threading.Event | None = None) -> None:
        self._requests = Bucket(rpm) if rpm else None
        self._tokens = Bucket(tpm) if tpm else None
        self._lock = threading.Lock()
        self._stop = stop  # once set, waiting workers return at once (the run is stopping)

    def acquire(self, tokens: int) -> None:
        while True:
            with self._lock:
                delay = self._try(tokens)
            if delay == 0.0 or (self._stop is not None and self._stop.is_set()):
                return
            time.sleep(min(delay, 1.0))  # short steps: a stop is noticed within a second

    def _try(self, tokens: int) -> float:
        wait_requests = self._requests.wait_for(1) if self._requests else 0.0
        if wait_requests:
            return wait_requests
        wait_tokens = self._tokens.wait_for(tokens) if self._tokens else 0.0
        if wait_tokens and self._requests:
            self._requests.level += 1  # give the request slot back: this request is not going yet
        return wait_tokens
