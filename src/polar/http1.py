"""Strict HTTP/1.1 request heads, and just enough more to relay messages one at a time.

Two places stand between an untrusted client and the gateway and read its
requests before the gateway does: the runtime's gateway relay
(:mod:`polar.runtime.relay`, whatever runs in a sandbox) and a gateway group's
router (:mod:`polar.proxy.workers.wire`). Each must see exactly the requests the
server behind it will see: a request smuggled past it inside another one's body
would reach routes it refuses, or a worker that disagrees on where a request
ends. So request heads are parsed strictly (RFC 9112), here and nowhere else,
and anything two parsers could read differently is refused instead of guessed
at: bare LF line ends, folded header lines, header names with characters
outside ``tchar``, control characters in values, several ``Content-Length``
headers or one with anything but digits, ``Transfer-Encoding`` other than
exactly ``chunked``, both framings at once, a request target that is not a path.
What a caller lets through (protocol upgrades, routes) is the caller's policy.
Responses come from the gateway (trusted) and are parsed leniently, only to
find where each ends.

Bodies are never buffered whole: :func:`relay_body` copies them in pieces
as they arrive, writing each before reading the next (backpressure).

A leaf: it imports nothing from Polar, so every layer may use it.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum

MAX_HEAD_BYTES = 65536
MAX_HEADERS = 128
MAX_CHUNK_LINE = 4096
CHUNK = 65536

_Put = Callable[[bytes], Awaitable[None]]

_TOKEN = re.compile(rb"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_VALUE_BAD = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_TARGET = re.compile(rb"^/[!-~]*$")
_CHUNK_SIZE = re.compile(rb"^([0-9A-Fa-f]{1,16})(;[^\r\n]*)?$")


class HttpError(Exception):
    """The peer sent something that is not (unambiguous) HTTP/1.1; ``status`` to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Framing(Enum):
    NONE = "none"
    LENGTH = "length"
    CHUNKED = "chunked"
    UNTIL_CLOSE = "until_close"


@dataclass(frozen=True, slots=True)
class Head:
    """A parsed message head: the start line's three parts and the header fields."""

    start: tuple[bytes, bytes, bytes]
    headers: tuple[tuple[bytes, bytes], ...]
    """(lower-cased name, value with surrounding whitespace removed), in order."""
    raw: bytes

    def values(self, name: bytes) -> list[bytes]:
        return [value for key, value in self.headers if key == name]

    def tokens(self, name: bytes) -> set[bytes]:
        """The comma-separated tokens of every ``name`` header, lower-cased."""
        found: set[bytes] = set()
        for value in self.values(name):
            found.update(part.strip().lower() for part in value.split(b",") if part.strip())
        return found


@dataclass(frozen=True, slots=True)
class Request:
    head: Head
    method: str
    target: str
    """The request target as sent (origin form: a path and maybe ``?query``)."""
    path: str
    version: bytes
    framing: Framing
    length: int

    @property
    def upgrade(self) -> bool:
        """Whether the client asks to switch protocols (``Upgrade``, or ``Connection: upgrade``)."""
        return bool(self.head.values(b"upgrade")) or b"upgrade" in self.head.tokens(b"connection")

    @property
    def keep_alive(self) -> bool:
        connection = self.head.tokens(b"connection")
        if b"close" in connection:
            return False
        return self.version == b"HTTP/1.1" or b"keep-alive" in connection


@dataclass(frozen=True, slots=True)
class Response:
    head: Head
    status: int
    version: bytes
    framing: Framing
    length: int

    @property
    def keep_alive(self) -> bool:
        connection = self.head.tokens(b"connection")
        if self.framing is Framing.UNTIL_CLOSE or b"close" in connection:
            return False
        return self.version != b"HTTP/1.0" or b"keep-alive" in connection


async def read_head(reader: asyncio.StreamReader) -> bytes | None:
    """The bytes of the next head, CRLF CRLF included; None at a clean end of stream."""
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise HttpError(400, "the connection ended inside a request head") from None
    except asyncio.LimitOverrunError:
        raise HttpError(431, f"request head larger than {MAX_HEAD_BYTES} bytes") from None


def parse_head(raw: bytes, *, strict: bool) -> Head:
    lines = raw[:-4].split(b"\r\n")
    if strict and any(b"\n" in line or b"\r" in line for line in lines):
        raise HttpError(400, "line ends must be CRLF")
    parts = lines[0].split(b" ", 2)
    if len(parts) != 3:
        raise HttpError(400, "malformed start line")
    if len(lines) - 1 > MAX_HEADERS:
        raise HttpError(431, f"more than {MAX_HEADERS} header fields")
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if strict and (not colon or not _TOKEN.match(name)):
            raise HttpError(400, f"malformed header line {line[:80]!r}")
        value = value.strip(b" \t")
        if strict and _VALUE_BAD.search(value):
            raise HttpError(400, f"control character in header {name.decode('latin-1')}")
        headers.append((name.strip().lower(), value))
    return Head((parts[0], parts[1], parts[2]), tuple(headers), raw)


def parse_request(raw: bytes) -> Request:
    """A strictly parsed request head (see the module docstring); raises HttpError."""
    head = parse_head(raw, strict=True)
    method, target, version = head.start
    if not _TOKEN.match(method):
        raise HttpError(400, "malformed method")
    if version not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise HttpError(505, f"unsupported protocol {version[:20]!r}")
    if not _TARGET.match(target):
        raise HttpError(400, "the request target must be a path (origin form)")
    lengths = head.values(b"content-length")
    encodings = head.values(b"transfer-encoding")
    if lengths and encodings:
        raise HttpError(400, "both Content-Length and Transfer-Encoding")
    framing, length = Framing.NONE, 0
    if encodings:
        if encodings != [b"chunked"] or version != b"HTTP/1.1":
            raise HttpError(501, "the only transfer coding relayed is chunked (HTTP/1.1)")
        framing = Framing.CHUNKED
    elif lengths:
        if len(lengths) != 1 or not lengths[0].isdigit() or len(lengths[0]) > 18:
            raise HttpError(400, "malformed Content-Length")
        framing, length = Framing.LENGTH, int(lengths[0])
    text = target.decode("ascii")
    return Request(
        head, method.decode("ascii"), text, text.partition("?")[0], version, framing, length
    )


def parse_response(raw: bytes, request_method: str) -> Response:
    """The gateway's response head (lenient: only its framing matters)."""
    head = parse_head(raw, strict=False)
    version, code, _ = head.start
    try:
        status = int(code)
    except ValueError:
        raise HttpError(502, "malformed status line from the gateway") from None
    framing, length = Framing.UNTIL_CLOSE, 0
    if request_method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        framing = Framing.NONE
    elif b"chunked" in head.tokens(b"transfer-encoding"):
        framing = Framing.CHUNKED
    elif head.values(b"content-length"):
        try:
            length = int(head.values(b"content-length")[0])
        except ValueError:
            raise HttpError(502, "malformed Content-Length from the gateway") from None
        framing = Framing.LENGTH
    return Response(head, status, version, framing, length)


async def relay_body(
    framing: Framing,
    length: int,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter | None,
    *,
    strict: bool,
) -> None:
    """Copy one body from ``reader`` to ``writer`` (None: read and drop it).

    Raises HttpError on a malformed chunked body and ``asyncio.IncompleteReadError``
    when the stream ends before the body does.
    """

    async def put(data: bytes) -> None:
        if writer is not None:
            writer.write(data)
            await writer.drain()

    match framing:
        case Framing.NONE:
            return
        case Framing.LENGTH:
            await _relay_exactly(reader, put, length)
        case Framing.UNTIL_CLOSE:
            while data := await reader.read(CHUNK):
                await put(data)
        case Framing.CHUNKED:
            await _relay_chunks(reader, put, strict=strict)


async def _relay_exactly(reader: asyncio.StreamReader, put: _Put, size: int) -> None:
    """Relay exactly ``size`` bytes, in pieces of at most :data:`CHUNK`."""
    left = size
    while left:
        data = await reader.read(min(CHUNK, left))
        if not data:
            raise asyncio.IncompleteReadError(b"", left)
        left -= len(data)
        await put(data)


async def _relay_chunks(reader: asyncio.StreamReader, put: _Put, *, strict: bool) -> None:
    while True:
        line = await _line(reader)
        match = _CHUNK_SIZE.match(line[:-2]) if strict else re.match(rb"\s*([0-9A-Fa-f]+)", line)
        if match is None:
            raise HttpError(400, "malformed chunk size line")
        size = int(match.group(1), 16)
        await put(line)
        if size == 0:
            break
        await _relay_exactly(reader, put, size)
        end = await reader.readexactly(2)
        if end != b"\r\n":
            raise HttpError(400, "chunk data not followed by CRLF")
        await put(end)
    while True:  # trailer fields, then the empty line
        line = await _line(reader)
        if strict and line != b"\r\n" and not _TOKEN.match(line.partition(b":")[0]):
            raise HttpError(400, "malformed trailer line")
        await put(line)
        if line == b"\r\n":
            return


async def _line(reader: asyncio.StreamReader) -> bytes:
    try:
        line = await reader.readuntil(b"\r\n")
    except asyncio.LimitOverrunError:
        raise HttpError(400, "chunk line too long") from None
    if len(line) > MAX_CHUNK_LINE:
        raise HttpError(400, "chunk line too long")
    return line
