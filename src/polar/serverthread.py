"""Run an ASGI app under uvicorn on a background thread.

A product utility (``polar demo``'s local stack, ``polar generate``'s
in-process rollout service, rehearsals, the scripted engine) that tests and
benchmarks use too; a leaf: it imports nothing from Polar.

The server binds its socket before :meth:`ServerThread.start` returns, so the
URL is usable immediately; port 0 picks a free port.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import uvicorn


class ServerThread:
    def __init__(
        self,
        app: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "warning",
        http: Any = "h11",
    ) -> None:
        """``http``: uvicorn's protocol (a name, or a class such as the gateway's
        :class:`polar.proxy.front.httpwire.GatewayHttpProtocol`)."""
        # proto must be IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted sockets
        # only when it is, and without it a response's body segment waits ~40 ms
        # for the delayed ACK of its header segment on every kept-alive request.
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.bind((host, port))
        self.host, self.port = self._sock.getsockname()[:2]
        config = uvicorn.Config(
            app,
            log_level=log_level,
            lifespan="on",
            loop="asyncio",
            http=http,
            timeout_graceful_shutdown=5,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name=f"uvicorn:{self.port}", daemon=True)
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _run(self) -> None:
        try:
            asyncio.run(self._server.serve(sockets=[self._sock]))
        except BaseException as exc:  # surfaced by start()/stop()
            self._error = exc

    def start(self, timeout_s: float = 30.0) -> ServerThread:
        self._thread.start()
        deadline = threading.Event()
        waited = 0.0
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"server on {self.url} failed to start: {self._error!r}")
            deadline.wait(0.01)
            waited += 0.01
            if waited > timeout_s:
                raise TimeoutError(f"server on {self.url} did not start in {timeout_s}s")
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)
        self._sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
