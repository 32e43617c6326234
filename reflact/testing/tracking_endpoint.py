"""A tracking server that fails, on a loopback port, for tests and benchmarks of tracking's deadline:

refuse     nothing listens: every connection is refused (a server that is down)
hang       connections are accepted and read, never answered (a frozen server)
drop       each request is read, then the connection is closed without a reply
blackhole  the port's accept queue is full and nobody accepts: connecting never completes
           (a host that drops packets)

with FailingTracking("hang") as endpoint:
    ... mlflow.tracking_uri=endpoint.uri ...
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, field

MODES = ("refuse", "hang", "drop", "blackhole")


@dataclass
class FailingTracking:
    mode: str
    port: int = 0
    _listener: socket.socket | None = None
    _held: list[socket.socket] = field(default_factory=list)  # open connections, closed at the end
    _stopped: threading.Event = field(default_factory=threading.Event)

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FailingTracking:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {self.mode!r}")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        self.port = listener.getsockname()[1]
        if self.mode == "refuse":
            listener.close()  # the port was free a moment ago: nothing listens on it now
            return self
        listener.listen(0 if self.mode == "blackhole" else 16)
        self._listener = listener
        if self.mode == "blackhole":
            self._fill_queue()
        else:
            threading.Thread(target=self._accept, name="failing-tracking", daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._stopped.set()
        for sock in [*self._held, *([self._listener] if self._listener else [])]:
            sock.close()

    def _fill_queue(self) -> None:
        """Connections nobody accepts, until the kernel's queue for the port is full (then it
        drops the next connection's packets instead of refusing them)."""
        for _ in range(4):
            client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            client.setblocking(False)
            client.connect_ex(("127.0.0.1", self.port))
            self._held.append(client)

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stopped.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:  # closed at the end
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.recv(65536)
        except OSError:
            pass
        if self.mode == "drop":
            conn.close()
            return
        self._held.append(conn)  # hang: read, never answered, kept open
