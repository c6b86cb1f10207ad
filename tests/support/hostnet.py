"""Real servers on the host for the sandbox network tests.

:class:`HostGateway` stands in for Polar's gateway: a plain HTTP server on
``127.0.0.1`` with the gateway's model routes (the only ones the sandbox relay
lets through): it answers ``GET /v1/models`` with a greeting, echoes
``POST /v1/chat/completions`` and streams ``POST /v1/responses`` in two
chunks, the second only once the test releases it (so a test can show that
the first chunk crossed the relay before the response ended).
:class:`Listener` is a TCP port that only counts connections: a sandbox that
must not reach the host is shown not to by its count not growing.
:data:`PROBE` is the program run inside a sandbox to try connections.
"""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

RELEASE_WAIT_S = 60.0

PROBE = """
import socket, sys
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
        print(target, "connected")
    except OSError as exc:
        print(target, "failed", exc.errno)
"""
"""``python3 -c PROBE host:port ...`` prints ``host:port connected`` or ``... failed <errno>``."""


def host_ip() -> str | None:
    """This machine's non-loopback IPv4 address (the default route's source), if any."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("203.0.113.1", 9))  # TEST-NET-3: routed, never sent to
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if address.startswith("127.") else address


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.server.owner.requests.append(("GET", self.path))
        if self.path == "/v1/models":
            self._json({"hello": "from the host", "path": self.path})
        else:
            self._json({"error": "not found"}, 404)

    def do_POST(self) -> None:
        self.server.owner.requests.append(("POST", self.path))
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path == "/v1/responses":
            self._stream()
        else:
            self._json({"echo": body.decode()})

    def _json(self, payload: dict[str, Any], status: int = 200) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._chunk(b"data: first\n\n")
        released = self.server.owner.release.wait(RELEASE_WAIT_S)
        self._chunk(b"data: second\n\n" if released else b"data: never released\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: HostGateway


class HostGateway:
    """The gateway stand-in; use as a context manager."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        self.release = threading.Event()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.owner = self
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def __enter__(self) -> HostGateway:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


class Listener:
    """A TCP port on ``host`` that counts the connections made to it; a context manager.

    No thread accepts them: a connection whose ``connect`` succeeded waits in the
    kernel's accept queue, and :attr:`accepted` drains the queue when read, so a
    count taken after a probe returned is exact.
    """

    def __init__(self, host: str) -> None:
        self.host = host
        self._accepted = 0
        self._socket = socket.create_server((host, 0), backlog=64)
        self._socket.setblocking(False)

    @property
    def port(self) -> int:
        return int(self._socket.getsockname()[1])

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def accepted(self) -> int:
        while True:
            try:
                connection, _ = self._socket.accept()
            except BlockingIOError:
                return self._accepted
            self._accepted += 1
            connection.close()

    def __enter__(self) -> Listener:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._socket.close()
