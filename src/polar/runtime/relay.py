"""The host side of the gateway relay: a Unix socket that leads to the gateway.

A sandbox with ``network: gateway_only`` has its own network namespace with
nothing but loopback, so the host's ``127.0.0.1:<gateway port>`` is out of its
reach. The runtime's state directory holds a Unix socket, bound read-only into
the sandbox; this server accepts on it and opens one TCP connection to the real
gateway per accepted connection. Inside, the sandbox's init listens on
``127.0.0.1:<port>`` and relays each connection to the socket (see
:mod:`polar.runtime.inside`), so the harness sees an ordinary HTTP server.

Bytes are copied as they come in both directions (server-sent events stream
through unchanged), with backpressure (a slow reader slows the writer, nothing
is buffered without bound) and half-closes passed on. A Unix socket reaches
only what the host listens on, so the sandbox gets the gateway and nothing else.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from polar.runtime.base import GatewayAddress
from polar.runtime.errors import RuntimeStartError
from polar.runtime.inside import bridge

MAX_SOCKET_PATH = 107
"""Longest Unix socket path Linux accepts (sun_path holds 108 bytes with the NUL)."""


class GatewayRelay:
    def __init__(self, socket_path: Path, gateway: GatewayAddress) -> None:
        if len(str(socket_path).encode()) > MAX_SOCKET_PATH:
            raise RuntimeStartError(f"gateway relay socket path too long: {socket_path}")
        self.socket_path = socket_path
        self._gateway = gateway
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        try:
            self._server = await asyncio.start_unix_server(self._accept, path=self.socket_path)
        except OSError as exc:
            raise RuntimeStartError(
                f"cannot listen on {self.socket_path}: {exc.strerror or exc}"
            ) from None

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        self.socket_path.unlink(missing_ok=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection(
                    self._gateway.host, self._gateway.port
                )
            except OSError:
                writer.close()
                return
            await bridge(reader, writer, up_reader, up_writer)
        finally:
            self._connections.discard(task)
