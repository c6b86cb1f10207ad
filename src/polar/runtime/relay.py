"""The host side of the gateway relay: a Unix socket that leads to the gateway's
model API, and nowhere else.

A sandbox with ``network: gateway_only`` has its own network namespace with
nothing but loopback, so the host's ``127.0.0.1:<gateway port>`` is out of its
reach. The runtime's state directory holds a Unix socket, bound read-only into
the sandbox; this server accepts on it. Inside, the sandbox's init listens on
``127.0.0.1:<port>`` and relays each connection to the socket byte for byte
(see :mod:`polar.runtime.inside`), so the harness sees an ordinary HTTP server.

**What passes.** Everything that runs in the sandbox is untrusted, so this end
reads each HTTP/1.1 request head (strictly, :mod:`polar.http1`) before
anything reaches the gateway, and forwards only

- the model API (:data:`MODEL_ROUTES`, and the Gemini API's
  :data:`GEMINI_ROUTE`), carrying the session's own key
  (``GatewayAddress.api_key``) in every credential it sends
  (``Authorization: Bearer``, ``x-api-key``, ``x-goog-api-key``, the query's
  ``key``), and
- the base-URL probe some CLIs send first (``HEAD /``, ``GET /``).

Anything else (the gateway's admin routes, a node or server API, another
session's key, a path spelled another way, protocol upgrades, malformed or
ambiguous framing) is answered here with a 4xx/5xx and the connection closed;
the gateway never sees it. Requests on a kept-alive connection are handled one
at a time: the next head is read only once the previous response ended, so
every request is inspected. Each request gets its own connection to the
gateway; the client's connection stays open for the next (at most
:data:`MAX_CONNECTIONS` per sandbox, each waiting at most :data:`IDLE_S` for
its next request).

**How bytes move.** Bodies and responses are copied as they arrive (server-sent
events stream through unchanged) with backpressure (a slow reader slows the
writer, nothing is buffered without bound); a client that half-closes after
its request still gets the whole response. A Unix socket reaches only what the
host listens on, so the sandbox gets the gateway's model routes and nothing
else.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import re
from pathlib import Path
from urllib.parse import parse_qs

from polar.bearer import bearer_token
from polar.http1 import (
    CHUNK,
    MAX_HEAD_BYTES,
    Framing,
    HttpError,
    Request,
    parse_request,
    parse_response,
    read_head,
    relay_body,
)
from polar.runtime.base import GatewayAddress
from polar.runtime.errors import RuntimeStartError

_log = logging.getLogger(__name__)

MAX_SOCKET_PATH = 107
"""Longest Unix socket path Linux accepts (sun_path holds 108 bytes with the NUL)."""

MODEL_ROUTES: frozenset[tuple[str, str]] = frozenset(
    {
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/responses"),
        ("POST", "/v1/messages"),
        ("POST", "/v1/messages/count_tokens"),
        ("GET", "/v1/models"),
    }
)
"""The gateway's model API: what a harness calls, with its session key."""
GEMINI_ROUTE = re.compile(
    r"/v1(?:beta)?/models/[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
    r":(?:generateContent|streamGenerateContent|countTokens)"
)
"""The Gemini API's model methods (``POST``): the model is part of the path."""
MAX_CONNECTIONS = 256
"""Connections one sandbox may hold open at once (each costs the host a descriptor)."""
IDLE_S = 120.0
"""How long a connection may wait for its next request head to arrive complete."""
LINGER_S = 2.0
"""How long a refused connection's remaining input is read and dropped before closing."""
PROBE_ROUTES: frozenset[tuple[str, str]] = frozenset({("HEAD", "/"), ("GET", "/")})
"""The base-URL probe (Claude Code sends ``HEAD /``); no key needed, nothing behind it."""

_REASONS = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    501: "Not Implemented",
    502: "Bad Gateway",
    505: "HTTP Version Not Supported",
}


class GatewayRelay:
    def __init__(self, socket_path: Path, gateway: GatewayAddress) -> None:
        if len(str(socket_path).encode()) > MAX_SOCKET_PATH:
            raise RuntimeStartError(f"gateway relay socket path too long: {socket_path}")
        self.socket_path = socket_path
        self._gateway = gateway
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.refused = 0
        """Requests answered here without reaching the gateway."""

    async def start(self) -> None:
        try:
            self._server = await asyncio.start_unix_server(
                self._accept, path=self.socket_path, limit=MAX_HEAD_BYTES
            )
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
        if len(self._connections) >= MAX_CONNECTIONS:
            self.refused += 1
            writer.close()
            return
        self._connections.add(task)
        try:
            while True:
                request = await self._next_request(reader, writer)
                if request is None:
                    return
                try:
                    up_reader, up_writer = await asyncio.open_connection(
                        self._gateway.host, self._gateway.port, limit=MAX_HEAD_BYTES
                    )
                except OSError:
                    await _answer(reader, writer, 502, "the gateway is not reachable", request)
                    return
                try:
                    if not await _exchange(request, reader, writer, up_reader, up_writer):
                        return
                finally:
                    up_writer.close()
        except (ConnectionError, OSError, asyncio.IncompleteReadError, HttpError):
            return
        except asyncio.CancelledError:
            # stop() cancels open connections; asyncio's server logs a connection
            # task that ends cancelled as an error, so this one ends quietly.
            return
        finally:
            self._connections.discard(task)
            writer.close()
            # Let the transport close its socket now: a relay stopped as its event loop
            # ends would otherwise leave the socket to the garbage collector, unclosed.
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await writer.wait_closed()

    async def _next_request(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> Request | None:
        """The next request that may pass, or None (answered and refused, or the end)."""
        try:
            async with asyncio.timeout(IDLE_S):
                raw = await read_head(reader)
            if raw is None:
                return None
            request = parse_request(raw)
            if request.upgrade:
                raise HttpError(400, "protocol upgrades are not relayed")
        except TimeoutError:
            return None
        except HttpError as exc:
            self.refused += 1
            await _answer(reader, writer, exc.status, exc.message, None)
            return None
        refusal = self._refusal(request)
        if refusal is not None:
            self.refused += 1
            _log.info("relay refused %s %s: %s", request.method, request.path[:200], refusal[1])
            await _answer(reader, writer, *refusal, request)
            return None
        return request

    def _refusal(self, request: Request) -> tuple[int, str] | None:
        route = (request.method, request.path)
        if route in PROBE_ROUTES:
            return None
        gemini = request.method == "POST" and GEMINI_ROUTE.fullmatch(request.path) is not None
        if route not in MODEL_ROUTES and not gemini:
            if any(path == request.path for _, path in (*MODEL_ROUTES, *PROBE_ROUTES)):
                return 405, f"{request.method} is not allowed on {request.path}"
            return 404, f"{request.path[:200]} is not a model API route"
        key = self._gateway.api_key
        if key is None:
            return None
        keys = request.head.values(b"x-api-key") + request.head.values(b"x-goog-api-key")
        in_query = [
            v.encode("latin-1")
            for v in parse_qs(request.target.partition("?")[2], keep_blank_values=True).get(
                "key", ()
            )
        ]
        if not (request.head.values(b"authorization") or keys or in_query):
            return 401, "no API key"
        expected = key.encode()
        for value in request.head.values(b"authorization"):
            token = bearer_token(value)
            if token is None or not hmac.compare_digest(token, expected):
                return 401, "not this session's API key"
        for value in keys + in_query:
            if not hmac.compare_digest(value.strip(), expected):
                return 401, "not this session's API key"
        return None


async def _exchange(
    request: Request,
    client_reader: asyncio.StreamReader,
    client_writer: asyncio.StreamWriter,
    up_reader: asyncio.StreamReader,
    up_writer: asyncio.StreamWriter,
) -> bool:
    """Forward one request and its response; True when the connection may carry another."""
    up_writer.write(request.head.raw)
    body = asyncio.ensure_future(
        relay_body(request.framing, request.length, client_reader, up_writer, strict=True)
    )
    try:
        keep_alive = await _relay_response(request, up_reader, client_writer)
        await body
    finally:
        if not body.done():
            body.cancel()
            with contextlib.suppress(BaseException):
                await body
    return keep_alive and request.keep_alive


async def _relay_response(
    request: Request, up_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
) -> bool:
    while True:
        raw = await read_head(up_reader)
        if raw is None:
            raise ConnectionError("the gateway closed the connection")
        response = parse_response(raw, request.method)
        client_writer.write(raw)
        await client_writer.drain()
        if 100 <= response.status < 200:
            if response.status == 101:
                raise ConnectionError("the gateway switched protocols")
            continue  # 100 Continue and other interim responses: the final one follows
        await relay_body(response.framing, response.length, up_reader, client_writer, strict=False)
        return response.keep_alive and response.framing is not Framing.UNTIL_CLOSE


async def _answer(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    status: int,
    message: str,
    request: Request | None,
) -> None:
    """Answer with an error (an OpenAI-style JSON body) and end the connection.

    The close lingers: after the answer and a half-close, what the client still
    sends (the refused request's body) is read and dropped for a moment, so the
    close does not reset the connection before the client read the answer.
    """
    body = json.dumps(
        {"error": {"message": f"polar relay: {message}", "type": "polar_relay", "code": status}}
    ).encode()
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    ).encode()
    writer.write(head if request is not None and request.method == "HEAD" else head + body)
    with contextlib.suppress(ConnectionError, OSError, TimeoutError):
        await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
        async with asyncio.timeout(LINGER_S):
            while await reader.read(CHUNK):
                pass
