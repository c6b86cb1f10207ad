"""HTTP/1.1 framing for the router: request heads, bodies, responses.

The router reads only what it must to route a call (the request head, the
body's framing) and passes the bytes on unchanged, so the worker parses the very
bytes the client sent. A head the router cannot frame without doubt (two
lengths, a transfer coding other than ``chunked``, folded header lines: the
strict parse of :mod:`polar.http1`) is refused with a 4xx/5xx before it reaches
a worker: the router and the worker can never disagree on where a request ends.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from http import HTTPStatus

from polar.http1 import Framing, HttpError, parse_request
from polar.proxy.dialects.registry import dialect_at
from polar.proxy.errors import ProxyError
from polar.proxy.front.httpwire import MAX_HEAD_BYTES

_READ = 1 << 16


class BadFraming(Exception):
    """The request cannot be framed without doubt; answered ``status`` (400 unless
    :mod:`polar.http1` names another), connection closed."""

    status = 400

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status


class HeadTooLarge(BadFraming):
    """The request head is over :data:`~polar.proxy.front.httpwire.MAX_HEAD_BYTES`
    (as a lone gateway answers it: 431, connection closed)."""

    status = 431


class ClientGone(Exception):
    """The client closed its connection before its request was whole."""


@dataclass(frozen=True, slots=True)
class Head:
    raw: bytes
    method: str
    target: str
    path: str
    headers: dict[str, str]
    """Lower-cased names; the last value wins (for what is not a credential)."""
    fields: tuple[tuple[bytes, bytes], ...]
    """Every header field in order, names lower-cased (credentials are read from
    these: a repeated one is refused, :func:`polar.proxy.front.inbound.credentials`)."""
    length: int | None
    chunked: bool
    keep_alive: bool


def parse_head(raw: bytes) -> Head:
    """The router's view of a request head, parsed strictly (:func:`polar.http1.parse_request`:
    what two parsers could frame differently is refused, with that module's status)."""
    try:
        request = parse_request(raw)
    except HttpError as exc:
        raise BadFraming(exc.message, status=exc.status) from None
    fields = request.head.headers
    return Head(
        raw=raw,
        method=request.method,
        target=request.target,
        path=request.path,
        headers={name.decode("latin-1"): value.decode("latin-1") for name, value in fields},
        fields=fields,
        length=request.length if request.framing is Framing.LENGTH else None,
        chunked=request.framing is Framing.CHUNKED,
        keep_alive=request.keep_alive,
    )


class Inbound:
    """A client connection's bytes: what has arrived and not been used yet."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader
        self.buf = bytearray()
        self.eof = False
        self._pending: asyncio.Future[bytes] | None = None

    def more(self) -> asyncio.Future[bytes]:
        """The one outstanding read (shared: also watched while a reply is awaited)."""
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._reader.read(_READ))
        return self._pending

    def took(self) -> bool:
        """Move a finished read into the buffer; ``False`` at the end of the stream."""
        pending = self._pending
        assert pending is not None and pending.done()
        self._pending = None
        data = pending.result()
        if data:
            self.buf += data
        else:
            self.eof = True
        return bool(data)

    async def fill(self) -> bool:
        if self.eof:
            return False
        await self.more()
        return self.took()

    def cancel(self) -> None:
        if self._pending is not None:
            self._pending.cancel()

    async def head(self) -> bytes | None:
        """The next request head, or ``None`` when the client closed between requests."""
        start = 0
        while True:
            end = self.buf.find(b"\r\n\r\n", start)
            if end >= 0:
                raw = bytes(self.buf[: end + 4])
                del self.buf[: end + 4]
                return raw
            if len(self.buf) > MAX_HEAD_BYTES:
                raise HeadTooLarge(f"request head larger than {MAX_HEAD_BYTES} bytes")
            start = max(0, len(self.buf) - 3)
            if not await self.fill():
                if self.buf:
                    raise ClientGone
                return None

    async def take(self, most: int) -> bytes:
        """Up to ``most`` bytes (at least one)."""
        while not self.buf:
            if not await self.fill():
                raise ClientGone
        chunk = bytes(self.buf[:most])
        del self.buf[: len(chunk)]
        return chunk

    async def line(self) -> bytes:
        while True:
            end = self.buf.find(b"\r\n")
            if end >= 0:
                raw = bytes(self.buf[: end + 2])
                del self.buf[: end + 2]
                return raw
            if len(self.buf) > 4096:
                raise BadFraming("chunk header line too long")
            if not await self.fill():
                raise ClientGone


async def copy_body(head: Head, inbound: Inbound, out: asyncio.StreamWriter) -> None:
    """Pass the request's body on as it arrives, framing unchanged."""
    if head.chunked:
        while True:
            line = await inbound.line()
            size_text = line[:-2].split(b";")[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise BadFraming("malformed chunk size") from None
            out.write(line)
            if size == 0:
                while line != b"\r\n":  # trailers, up to the empty line
                    line = await inbound.line()
                    out.write(line)
                return
            await _copy(inbound, out, size + 2)
    if head.length:
        await _copy(inbound, out, head.length)


async def _copy(inbound: Inbound, out: asyncio.StreamWriter, size: int) -> None:
    while size:
        chunk = await inbound.take(size)
        out.write(chunk)
        size -= len(chunk)
        if out.transport.get_write_buffer_size() > (1 << 20):
            await out.drain()


async def read_body(head: Head, inbound: Inbound, limit: int) -> bytes:
    """A whole (small) body, for the requests the router answers itself."""
    if head.chunked:
        parts: list[bytes] = []
        total = 0
        while True:
            line = await inbound.line()
            try:
                size = int(line[:-2].split(b";")[0].strip(), 16)
            except ValueError:
                raise BadFraming("malformed chunk size") from None
            total += size
            if total > limit:
                raise BadFraming(f"request body larger than {limit} bytes")
            if size == 0:
                while line != b"\r\n":  # trailers, up to the empty line
                    line = await inbound.line()
                return b"".join(parts)
            parts.append((await _exact(inbound, size + 2))[:-2])
    size = head.length or 0
    if size > limit:
        raise BadFraming(f"request body larger than {limit} bytes")
    return await _exact(inbound, size)


async def _exact(inbound: Inbound, size: int) -> bytes:
    parts: list[bytes] = []
    while size:
        chunk = await inbound.take(size)
        parts.append(chunk)
        size -= len(chunk)
    return b"".join(parts)


def response(
    status: int, body: bytes, *, content_type: str = "application/json", close: bool = False
) -> bytes:
    reason = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else ""
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\n"
        f"content-length: {len(body)}\r\n"
    )
    if close:
        head += "connection: close\r\n"
    return head.encode("latin-1") + b"\r\n" + body


def error_reply(path: str, error: ProxyError, *, close: bool = False) -> bytes:
    """An error from the router itself, in the shape of the dialect the path serves
    (:func:`~polar.proxy.dialects.registry.dialect_at`)."""
    return response(error.status, dialect_at(path).error_body(error), close=close)
