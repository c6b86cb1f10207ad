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

from polar.proxy.control import admin
from polar.proxy.dialects.registry import DIALECTS
from polar.proxy.dialects.spec import DialectSpec, Mounted
from polar.proxy.errors import InvalidRequest, NotFound
from polar.proxy.front.asgi import ASGIApp, Router
from polar.proxy.gateway import Gateway


@dataclass(frozen=True, slots=True)
class Extension:
    """More routes served next to the gateway's (a gateway node's ``/node`` API),
    started after the gateway and stopped before it."""

    routes: Sequence[BaseRoute]
    start: Callable[[], Awaitable[None]]
    stop: Callable[[], Awaitable[None]]


def create_app(
    gateway: Gateway,
    *,
    extensions: Sequence[Extension] = (),
    dialects: Sequence[DialectSpec] = DIALECTS,
) -> Router:
    """The root ASGI app: model calls on plain-ASGI hot routes, the rest on Starlette.

    Each dialect's endpoints are hot routes (a prefix endpoint matches what is
    under it); an error Starlette raises under a path a dialect owns (a wrong
    method under Gemini's ``/v1beta/models/``) is written in that dialect's shape,
    any other in OpenAI's envelope.
    """
    mounted = [(spec, spec.mount(gateway)) for spec in dialects]

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

    app = Starlette(
        routes=[
            Route("/health", _health, methods=["GET"]),
            Route("/", _root, methods=["GET", "HEAD"]),
            *admin.routes(),
            *(route for _, served in mounted for route in served.routes),
            *(route for extension in extensions for route in extension.routes),
        ],
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_error},
    )
    app.state.gateway = gateway
    app.state.dialects = dialects
    return Router(
        _hot_routes(mounted, prefix=False), fallback=app, prefixes=_hot_routes(mounted, prefix=True)
    )


async def _health(request: Request) -> Response:
    # 503 when calls cannot be recorded: a load balancer stops sending them here.
    healthy, details = request.app.state.gateway.health()
    return JSONResponse(details, status_code=200 if healthy else 503)


async def _root(request: Request) -> Response:
    # Some harnesses probe the base URL (Claude Code sends HEAD /) before calling.
    return JSONResponse({"status": "ok", "service": "polar gateway"})


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = f"{request.method} {request.url.path}: {exc.detail}"
    dialects: Sequence[DialectSpec] = request.app.state.dialects
    owner = next((spec for spec in dialects if spec.owns(request.url.path)), None)
    if owner is not None:
        error = NotFound(message) if exc.status_code == 404 else InvalidRequest(message)
        error.status = exc.status_code
        return JSONResponse(owner.error_json(error), status_code=exc.status_code)
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


def _hot_routes(
    mounted: Sequence[tuple[DialectSpec, Mounted]], *, prefix: bool
) -> dict[tuple[str, str], ASGIApp]:
    routes: dict[tuple[str, str], ASGIApp] = {}
    for spec, served in mounted:
        for endpoint in spec.endpoints:
            if endpoint.prefix is not prefix:
                continue
            key = (endpoint.method, endpoint.path)
            if key in routes:
                raise ValueError(f"dialect {spec.name.value}: {key} is served by another dialect")
            routes[key] = served.hot[endpoint]
    return routes
