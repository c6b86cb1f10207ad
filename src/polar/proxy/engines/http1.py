"""A small, fast HTTP/1.1 client for the gateway-to-engine hop.

Why not httpx: on the gateway's hot path its connection pool checks every idle
connection on every request, and its anyio layers add a task switch per read;
under a few hundred concurrent sessions that was most of the gateway's CPU.
This client is an ``asyncio.Protocol`` with the C ``httptools`` response
parser, a LIFO pool of keep-alive connections (one idle for ``keepalive_s`` or
longer is closed, not reused: engines close idle connections themselves, vLLM
and SGLang after 5 s, and a request sent as they do is lost), and two timers
per response:
one for silence (``read_timeout_s`` until the first body byte, then
``idle_timeout_s`` between bytes; not counted while the gateway's own client
is too slow to take more) and one for the whole reply (``total_timeout_s``).
It speaks exactly what engines need: POST with a body, ``Content-Length`` or
chunked replies, keep-alive, optional TLS.

A request that fails on a pooled connection is *not* resent here: the engine
may have received it, so the caller retries it as a new attempt under its own
request id (:attr:`ConnectionLost.reused` tells it the connection was an idle
one, which servers close at will). Such a failure also closes every connection
idle since before the one that failed, so the retry does not meet another.

Failures surface as :class:`TransportFailure` subclasses, which the engine
transport maps to the gateway's error tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from typing import cast
from urllib.parse import urlsplit

import httptools

# Pause reading from the engine when a slow client leaves this much unread.
_HIGH_WATER = 1 << 20


class TransportFailure(Exception):
    """Base of this module's errors."""


class ConnectFailure(TransportFailure):
    """The connection could not be opened."""


class ReadTimeout(TransportFailure):
    """The server went silent for longer than the read timeout."""


class ConnectionLost(TransportFailure):
    """The connection broke before the reply was complete."""

    reused = False
    """The request went out on an idle pooled connection and no reply began."""


class ProtocolFailure(TransportFailure):
    """The server's reply is not valid HTTP/1.1."""


class Response:
    """A reply whose body is read as it arrives."""

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self._headers_done: asyncio.Future[None] = conn.loop.create_future()
        self.complete = False
        self.error: TransportFailure | None = None
        self.body_started = False

    def header(self, name: bytes) -> bytes | None:
        lowered = name.lower()
        for key, value in self.headers:
            if key.lower() == lowered:
                return value
        return None

    # called by the connection
    def _feed(self, data: bytes) -> None:
        self.body_started = True
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > _HIGH_WATER:
            self._conn.pause()
        self._wake()

    def _finish(self, error: TransportFailure | None) -> None:
        if self.complete or self.error is not None:
            return
        if error is None:
            self.complete = True
        else:
            self.error = error
        if not self._headers_done.done():
            if error is None:
                self._headers_done.set_result(None)
            else:
                self._headers_done.set_exception(error)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive, all that is buffered at once. Ends when
        the reply is complete."""
        async with contextlib.aclosing(self._drained()) as drained:
            async for pieces in drained:
                yield pieces[0] if len(pieces) == 1 else b"".join(pieces)

    async def read(self) -> bytes:
        parts: list[bytes] = []
        async with contextlib.aclosing(self._drained()) as drained:
            async for pieces in drained:
                parts += pieces
        return b"".join(parts)

    async def _drained(self) -> AsyncGenerator[list[bytes], None]:
        """What has arrived each time, as received."""
        try:
            while True:
                if self._chunks:
                    pieces = list(self._chunks)
                    self._chunks.clear()
                    self._buffered = 0
                    self._conn.resume()
                    yield pieces
                    continue
                if self.error is not None:
                    raise self.error
                if self.complete:
                    return
                self._waiter = self._conn.loop.create_future()
                await self._waiter
                self._waiter = None
        finally:
            self._conn.done_with(self)


class _Connection(asyncio.Protocol):
    def __init__(self, pool: Http1Pool) -> None:
        self.pool = pool
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: Response | None = None
        self.closed = False
        self._timer: asyncio.TimerHandle | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._paused = False
        self.idle_since = 0.0
        """When the pool last took it back (the loop's clock)."""

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport; they implement it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(ProtocolFailure("unexpected protocol upgrade"))
            return
        except httptools.HttpParserError as exc:
            self._fail(ProtocolFailure(f"invalid HTTP reply: {exc}"))
            return
        self._arm_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._cancel_timers()
        if self.response is not None:
            self.response._finish(
                ConnectionLost(f"connection closed by the server ({exc or 'EOF'})")
            )
        self.pool.forget(self)

    # -- httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if self.response is not None:
            self.response.headers.append((name, value))

    def on_headers_complete(self) -> None:
        response = self.response
        if response is not None:
            response.status = self.parser.get_status_code()
            if not response._headers_done.done():
                response._headers_done.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self.response is not None:
            self.response._feed(body)

    def on_message_complete(self) -> None:
        self._cancel_timers()
        response = self.response
        keep = self.parser.should_keep_alive()
        if response is not None:
            response._finish(None)
        if not keep:
            self.close()

    # -- request cycle
    async def send(self, head: bytes, body: bytes) -> Response:
        assert self.transport is not None
        self.response = Response(self)
        self.parser = httptools.HttpResponseParser(self)
        self.transport.write(head + body)
        self._arm_timer()
        total = self.pool.total_timeout_s
        self._deadline = self.loop.call_later(total, self._on_deadline, self.response, total)
        await self.response._headers_done
        return self.response

    def done_with(self, response: Response) -> None:
        """The reader is finished with ``response``: pool the connection or drop it."""
        if self.response is not response:
            return
        self.response = None
        self._cancel_timers()
        if response.complete and not self.closed:
            self.resume()
            self.pool.release(self)
        else:
            self.close()

    def pause(self) -> None:
        # The gateway's client is slow: the engine's silence is not its own now.
        if not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
            self._cancel_timer()

    def resume(self) -> None:
        if self._paused and self.transport is not None and not self.closed:
            self._paused = False
            self.transport.resume_reading()
            self._arm_timer()

    def close(self) -> None:
        self._cancel_timers()
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()
        self.pool.forget(self)

    def _fail(self, error: TransportFailure) -> None:
        if self.response is not None:
            self.response._finish(error)
        self.close()

    def _arm_timer(self) -> None:
        self._cancel_timer()
        response = self.response
        if response is None or response.complete or response.error is not None or self._paused:
            return
        started = response.body_started
        timeout = self.pool.idle_timeout_s if started else self.pool.read_timeout_s
        self._timer = self.loop.call_later(timeout, self._on_timeout, timeout, started)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _cancel_timers(self) -> None:
        self._cancel_timer()
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _on_timeout(self, timeout: float, started: bool) -> None:
        self._timer = None
        if started:
            self._fail(ReadTimeout(f"the server went silent mid-reply for {timeout:g}s"))
        else:
            self._fail(ReadTimeout(f"no reply from the server within {timeout:g}s"))

    def _on_deadline(self, response: Response, total: float) -> None:
        self._deadline = None
        if self.response is response:
            self._fail(ReadTimeout(f"the reply took longer than {total:g}s in all"))


class Http1Pool:
    """Keep-alive connections to one origin (``http://host:port`` or ``https://...``)."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 900.0,
        idle_timeout_s: float = 60.0,
        total_timeout_s: float = 3600.0,
        max_idle: int = 1024,
        keepalive_s: float = 4.0,
        default_headers: dict[str, str] | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        netloc = parts.netloc.rpartition("@")[2]
        self._host_header = netloc.encode()
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.total_timeout_s = total_timeout_s
        self._max_idle = max_idle
        self.keepalive_s = keepalive_s
        self._idle: list[_Connection] = []
        """Oldest first: :meth:`release` appends, :meth:`_reuse` pops the newest."""
        self._all: set[_Connection] = set()
        extra = "".join(f"{k}: {v}\r\n" for k, v in (default_headers or {}).items())
        self._extra_headers = extra.encode("latin-1")

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Connection(self), self.host, self.port, ssl=self._ssl
                ),
                timeout=self.connect_timeout_s,
            )
        except TimeoutError:
            raise ConnectFailure(
                f"connecting to {self.host}:{self.port} timed out after {self.connect_timeout_s:g}s"
            ) from None
        except OSError as exc:
            raise ConnectFailure(f"cannot connect to {self.host}:{self.port}: {exc}") from None
        self._all.add(conn)
        return conn

    async def request(
        self, method: str, path: str, body: bytes, headers: dict[str, str]
    ) -> Response:
        """Send a request; returns once the reply's status and headers arrived."""
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode("latin-1")
        head = (
            f"{method} {self.prefix}{path} HTTP/1.1\r\n".encode("latin-1")
            + b"host: "
            + self._host_header
            + b"\r\ncontent-length: "
            + str(len(body)).encode()
            + b"\r\n"
            + self._extra_headers
            + extra
            + b"\r\n"
        )
        conn = self._reuse()
        reused = conn is not None
        if conn is None:
            conn = await self._connect()
        try:
            return await conn.send(head, body)
        except ConnectionLost as exc:
            # An idle connection the server had closed shows only now. The
            # request may have reached the server: resending is the caller's
            # decision (a new attempt, recorded as such), never this pool's.
            conn.close()
            exc.reused = reused
            if reused:  # those idle longer are as likely closed: not for the retry
                self._close_idle(since=conn.idle_since)
            raise
        except BaseException:
            conn.close()
            raise

    def _reuse(self) -> _Connection | None:
        """The newest idle connection if it has not been idle too long (then
        none is: every other one is older, and all are closed)."""
        if not self._idle:
            return None
        conn = self._idle.pop()
        if conn.loop.time() - conn.idle_since < self.keepalive_s:
            return conn
        conn.close()
        self._close_idle(since=conn.idle_since)
        return None

    def _close_idle(self, since: float) -> None:
        """Close the idle connections taken back at ``since`` or before."""
        for conn in [c for c in self._idle if c.idle_since <= since]:
            conn.close()  # forget() takes it out of the idle list

    def release(self, conn: _Connection) -> None:
        if len(self._idle) < self._max_idle:
            conn.idle_since = conn.loop.time()
            self._idle.append(conn)
        else:
            conn.close()

    def forget(self, conn: _Connection) -> None:
        self._all.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)

    async def aclose(self) -> None:
        for conn in list(self._all):
            conn.close()
        self._idle.clear()
        await asyncio.sleep(0)
