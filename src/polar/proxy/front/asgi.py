"""Plain-ASGI plumbing for the gateway's hot path.

Model calls skip Starlette's routing and middleware (a measurable share of the
gateway's CPU per call at a few hundred concurrent sessions); everything else
(admin, health, 404s) is a normal Starlette app behind the same root.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from starlette.types import ASGIApp, Receive, Scope, Send

from polar.proxy.errors import BodyTooLarge

__all__ = ["ASGIApp", "DisconnectWatch", "Receive", "Router", "Scope", "Send"]

JSON = [(b"content-type", b"application/json")]
SSE = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def headers_of(scope: Scope) -> dict[str, str]:
    """Request headers, lower-cased names (the last value wins)."""
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


async def read_body(receive: Receive, limit: int, declared: str | None) -> bytes:
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"request body of {declared} bytes exceeds the limit of {limit}")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise asyncio.CancelledError("client disconnected while sending its request")
        body = message.get("body", b"")
        size += len(body)
        if size > limit:
            raise BodyTooLarge(f"request body exceeds the limit of {limit} bytes")
        chunks.append(body)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def send_body(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] = JSON
) -> None:
    # A declared length lets the server write headers and body in one go; without
    # it the body goes out chunked, in writes that can sit behind delayed ACKs.
    length = (b"content-length", str(len(body)).encode())
    await send({"type": "http.response.start", "status": status, "headers": [*headers, length]})
    await send({"type": "http.response.body", "body": body})


class DisconnectWatch:
    """Cancels the current task if the client disconnects before ``done()``.

    ASGI servers drop writes to a closed connection silently, so a handler
    would otherwise keep an engine generating for nobody. Under the gateway's
    own server (:mod:`polar.proxy.front.httpwire`) the connection calls back when it
    is lost; under any other ASGI server one extra task per call waits on
    ``receive()`` for ``http.disconnect``. The handler catches the cancellation
    and records the call as aborted.
    """

    def __init__(self, receive: Receive, scope: Scope | None = None) -> None:
        self.disconnected = False
        self._finished = False
        self._task = asyncio.current_task()
        self._waiter: asyncio.Future[None] | None = None
        self._unwatch: Callable[[], None] | None = None
        connection = (scope or {}).get("polar.connection")
        if connection is not None:
            self._unwatch = connection.on_lost(self._lost)
        else:
            self._waiter = asyncio.ensure_future(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self._lost()
                return

    def _lost(self) -> None:
        if not self._finished and self._task is not None:
            self.disconnected = True
            self._task.cancel()

    def done(self) -> None:
        self._finished = True
        if self._waiter is not None:
            self._waiter.cancel()
        if self._unwatch is not None:
            self._unwatch()


class Router:
    """Root ASGI app: exact ``(method, path)`` hot routes, then ``(method, prefix)``
    hot routes (paths that name something, as Gemini's ``/v1beta/models/{model}:...``),
    everything else to ``fallback``."""

    def __init__(
        self,
        routes: Mapping[tuple[str, str], ASGIApp],
        fallback: ASGIApp,
        prefixes: Mapping[tuple[str, str], ASGIApp] | None = None,
    ) -> None:
        self._routes = dict(routes)
        self._prefixes = tuple((m, p, app) for (m, p), app in (prefixes or {}).items())
        self._fallback = fallback

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            method, path = scope["method"], scope["path"]
            handler = self._routes.get((method, path))
            if handler is None:
                handler = next(
                    (a for m, p, a in self._prefixes if m == method and path.startswith(p)), None
                )
            if handler is not None:
                await handler(scope, receive, send)
                return
        await self._fallback(scope, receive, send)
