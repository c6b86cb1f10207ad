"""The gateway's HTTP/1.1 server: uvicorn on uvloop and httptools, with the
writes of one event-loop turn sent in one system call.

uvicorn writes a reply's head when the handler sends ``http.response.start``
and each body part as it is sent, a system call each. On loopback, where a
gateway and its agents usually meet, every write also costs the sender the
receiving side's TCP work, so a reply that leaves as a head and a body costs
two of those. :class:`CoalescingTransport` holds the writes made during one
turn of the event loop and sends them together at its end: a whole reply, or
a streamed reply's head with the deltas that were already there, leaves in
one write.

Contract and cost: bytes leave in the order written, at most one loop turn
later (the loop runs the flush before it next waits for I/O); ``close()``
sends what is held first; ``abort()`` drops it, as the transport's own abort
drops its buffer. A connection holds at most one turn's writes.

uvicorn's httptools protocol also takes request heads of any size (a header
of megabytes is buffered whole). :class:`GatewayHttpProtocol` answers a head
(request line and header fields) over :data:`MAX_HEAD_BYTES` with ``431
Request Header Fields Too Large`` and closes the connection: counted exactly
as the fields are parsed, and, for a head that does not end, as its bytes
arrive.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class CoalescingTransport:
    """A transport whose writes in one loop turn reach the socket as one."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if self._held is None:
            self._held = [bytes(data)]
            self._loop.call_soon(self.flush)
        else:
            self._held.append(bytes(data))

    def writelines(self, parts: Any) -> None:
        for part in parts:
            self.write(part)

    def flush(self) -> None:
        held, self._held = self._held, None
        if held:
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        held = sum(len(part) for part in self._held) if self._held else 0
        return int(self._transport.get_write_buffer_size()) + held

    def __getattr__(self, name: str) -> Any:
        # Everything else (is_closing, get_extra_info, pause_reading, ...) is the transport's.
        return getattr(self._transport, name)


CONNECTION = "polar.connection"
"""Scope key of the :class:`GatewayHttpProtocol` serving a request."""

MAX_HEAD_BYTES = 64 << 10
"""The largest request head (request line and header fields) the gateway reads,
bytes; the router of a gateway group and the sandbox relay take the same."""

_READ_BYTES = 256 << 10
"""The most one read hands the protocol (a head that has not ended may be
counted with the end of the request before it, once)."""


class _HeadTooLarge(Exception):
    """Raised in a parser callback: the head is over :data:`MAX_HEAD_BYTES`."""


class GatewayHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol on a :class:`CoalescingTransport`, which
    also tells a handler when its client goes (:meth:`on_lost`) without the
    handler keeping a task waiting on ``receive()`` for it."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._lost_callbacks: set[Callable[[], None]] = set()
        self._gone = False
        self._in_head = True  # reading a request head (or waiting for one)
        self._head_bytes = 0  # its request line and fields, as parsed
        self._head_received = 0  # what arrived since it began, ended or not
        self._head_too_large = False
        super().connection_made(CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._in_head and not self._head_too_large:
            self._head_received += len(data)
            if self._head_received > MAX_HEAD_BYTES + _READ_BYTES:  # a head that never ends
                self._head_too_large = True
                self.send_400_response("")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope[CONNECTION] = self  # type: ignore[literal-required]

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head, self._head_bytes, self._head_received = True, 0, 0

    def _count(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > MAX_HEAD_BYTES:
            self._head_too_large = True
            raise _HeadTooLarge  # httptools stops; uvicorn calls send_400_response

    def send_400_response(self, msg: str) -> None:
        if not self._head_too_large:
            super().send_400_response(msg)
            return
        body = (
            b'{"error": {"message": "the request head (request line and headers) is larger '
            b'than %d bytes", "type": "request_header_fields_too_large"}}' % MAX_HEAD_BYTES
        )
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
        )
        self.transport.close()

    def on_lost(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` once if the connection is lost; returns what stops that."""
        if self._gone:
            self.loop.call_soon(callback)
            return _nothing
        self._lost_callbacks.add(callback)
        return functools.partial(self._lost_callbacks.discard, callback)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._gone = True
        callbacks, self._lost_callbacks = self._lost_callbacks, set()
        for callback in callbacks:
            callback()


def _nothing() -> None:
    pass


def run_server(app: Any, *, log_level: str, keepalive_s: int, **where: Any) -> None:
    """Serve ``app`` until SIGINT/SIGTERM; ``where``: ``host`` and ``port``, or ``uds``."""
    import uvicorn

    uvicorn.run(
        app,
        log_level=log_level,
        loop="uvloop",
        http=GatewayHttpProtocol,
        access_log=False,
        proxy_headers=False,  # nothing reads the client's address: no X-Forwarded-* step
        timeout_keep_alive=keepalive_s,
        **where,
    )
