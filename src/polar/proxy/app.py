"""The gateway's ASGI application, built by a factory from a :class:`Gateway`."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from polar.proxy import admin
from polar.proxy.asgi import Router
from polar.proxy.dialects.anthropic_messages import routes as anthropic_messages
from polar.proxy.dialects.gemini import routes as gemini
from polar.proxy.dialects.gemini.protocol import PATH_PREFIXES as GEMINI_PATHS
from polar.proxy.dialects.gemini.translate import error_json as gemini_error
from polar.proxy.dialects.openai_chat import routes as openai_chat
from polar.proxy.dialects.openai_responses import routes as openai_responses
from polar.proxy.errors import InvalidRequest, NotFound
from polar.proxy.gateway import Gateway


@dataclass(frozen=True, slots=True)
class Extension:
    """More routes served next to the gateway's (a gateway node's ``/node`` API),
    started after the gateway and stopped before it."""

    routes: Sequence[BaseRoute]
    start: Callable[[], Awaitable[None]]
    stop: Callable[[], Awaitable[None]]


def create_app(gateway: Gateway, *, extensions: Sequence[Extension] = ()) -> Router:
    """The root ASGI app: model calls on plain-ASGI hot routes, the rest on Starlette."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await gateway.start()
        started: list[Extension] = []
        try:
            for extension in extensions:
                await extension.start()
                started.append(extension)
            yield
        finally:
            for extension in reversed(started):
                await extension.stop()
            await gateway.stop()

    async def health(request: Request) -> Response:
        # 503 when calls cannot be recorded: a load balancer stops sending them here.
        healthy, details = gateway.health()
        return JSONResponse(details, status_code=200 if healthy else 503)

    async def root(request: Request) -> Response:
        # Some harnesses probe the base URL (Claude Code sends HEAD /) before calling.
        return JSONResponse({"status": "ok", "service": "polar gateway"})

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        message = f"{request.method} {request.url.path}: {exc.detail}"
        if request.url.path.startswith(GEMINI_PATHS):  # Google's shape under its paths
            error = NotFound(message) if exc.status_code == 404 else InvalidRequest(message)
            error.status = exc.status_code
            return JSONResponse(gemini_error(error), status_code=exc.status_code)
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(
            {
                "error": {
                    "message": message,
                    "type": kind,
                    "param": None,
                    "code": None,
                }
            },
            status_code=exc.status_code,
        )

    app = Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/", root, methods=["GET", "HEAD"]),
            *admin.routes(),
            *openai_chat.routes(gateway),
            *(route for extension in extensions for route in extension.routes),
        ],
        lifespan=lifespan,
        exception_handlers={HTTPException: http_error},
    )
    app.state.gateway = gateway
    return Router(
        {
            **openai_chat.hot_routes(gateway),
            **anthropic_messages.hot_routes(gateway),
            **openai_responses.hot_routes(gateway),
        },
        fallback=app,
        prefixes=gemini.hot_prefixes(gateway),
    )
