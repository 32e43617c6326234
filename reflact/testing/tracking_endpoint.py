"""A tracking server that fails, on a loopback port, for tests and benchmarks of tracking's deadline:

refuse     nothing listens: every connection is refused (a server that is down)
hang       connections are accepted and read, never answered (a frozen server)
drop       each request is read, then the connection is closed without a reply
blackhole  the port's accept queue is full and nobody accepts: connecting never completes
           (a host that drops packets)

and a real server made slow or frozen at a chosen request (SlowProxy).

with FailingTracking("hang") as endpoint:
    ... mlflow.tracking_uri=endpoint.uri ...
"""

from __future__ import annotations

import socket
import threading
import time
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


METHODS = (b"GET ", b"POST ", b"PUT ", b"PATCH ", b"DELETE ", b"HEAD ")


@dataclass
class SlowProxy:
    """A real tracking server behind a loopback proxy that makes it slow or freezes it:

    delay_s     every request reaches the server this much later (a server that answers slowly)
    freeze_on   from the first request whose path starts with one of these on (after
                `freeze_after` such requests went through), nothing more is forwarded either way,
                connections stay open (a server frozen at that moment), until `thaw()`

    with SlowProxy(server_url, freeze_on=("/api/2.0/mlflow/runs/log-batch",)) as proxy:
        ... mlflow.tracking_uri=proxy.uri ...
    """

    target: str  # http://127.0.0.1:PORT of the real server
    delay_s: float = 0.0
    freeze_on: tuple[str, ...] = ()
    freeze_after: int = 0
    port: int = 0
    requests: list[str] = field(default_factory=list)  # the request lines seen, in order
    frozen: threading.Event = field(default_factory=threading.Event)
    _thawed: threading.Event = field(default_factory=threading.Event)
    _listener: socket.socket | None = None
    _held: list[socket.socket] = field(default_factory=list)

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> SlowProxy:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, name="slow-proxy", daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._thawed.set()
        for sock in [*self._held, *([self._listener] if self._listener else [])]:
            sock.close()

    def thaw(self) -> None:
        self._thawed.set()

    def _accept(self) -> None:
        assert self._listener is not None
        host, port = self.target.rsplit("/", 1)[-1].rsplit(":", 1)
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed at the end
                return
            try:
                server = socket.create_connection((host, int(port)))
            except OSError:  # the server is not there: so is the proxy, for this connection
                client.close()
                continue
            self._held += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, requests: bool) -> None:
        try:
            while chunk := source.recv(65536):
                if requests and chunk.startswith(METHODS):
                    self._request(chunk.split(b"\r\n", 1)[0].decode("latin-1"))
                if self.frozen.is_set():
                    self._thawed.wait()
                sink.sendall(chunk)
        except OSError:
            pass

    def _request(self, line: str) -> None:
        self.requests.append(line)
        path = line.split(" ")[1] if " " in line else ""
        if any(path.startswith(prefix) for prefix in self.freeze_on):
            self.freeze_after -= 1
            if self.freeze_after < 0:
                self.frozen.set()
        if self.delay_s:
            time.sleep(self.delay_s)
