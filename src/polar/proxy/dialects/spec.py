"""What a dialect is to the rest of Polar: one :class:`DialectSpec` per package.

The gateway's app serves a dialect's :attr:`~DialectSpec.endpoints` with the
handlers its :meth:`~DialectSpec.mount` builds; the gateway group's router
answers its own errors at those paths in the dialect's shape
(:meth:`~DialectSpec.error_body`); the rollout side reads a record's stored
request back with :attr:`~DialectSpec.read_stored`. None of them names a
dialect: they iterate :mod:`polar.proxy.dialects.registry`.

This module and the descriptors are light on purpose (the router and the
rollout side import them): a dialect's handlers, and the gateway they need, are
named by module and imported only when ``mount`` is called, as
:mod:`polar.plugins` imports a built-in plug-in only when it is asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from polar.ir import ChatRequest, Dialect
from polar.proxy.errors import ProxyError

if TYPE_CHECKING:
    from starlette.routing import BaseRoute
    from starlette.types import ASGIApp

    from polar.proxy.gateway import Gateway


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A model call's method and path, served on the gateway's plain-ASGI hot path."""

    method: str
    path: str
    prefix: bool = False
    """``path`` is a prefix: the rest of the path names something (Gemini's
    ``/v1beta/models/{model}:{method}``); the dialect answers everything under it."""


@dataclass(frozen=True, slots=True)
class Mounted:
    """A dialect's handlers for one gateway."""

    hot: Mapping[Endpoint, ASGIApp]
    """One handler for each of the dialect's endpoints."""
    routes: Sequence[BaseRoute] = ()
    """Anything else it serves, on the Starlette app (OpenAI's ``GET /v1/models``)."""


@dataclass(frozen=True, slots=True)
class DialectSpec:
    """One provider dialect: what it serves, how its errors look, how its stored
    requests are read back."""

    name: Dialect
    endpoints: tuple[Endpoint, ...]
    routes: str
    """The module (``package.module``) whose ``mount(gateway) -> Mounted`` builds
    the handlers of :attr:`endpoints` and of any other routes."""
    read_stored: Callable[[dict[str, Any], bool], ChatRequest]
    """A record's stored wire body (and whether the call streamed: Gemini says so
    in its path, not its body) as the IR request the gateway made of it."""
    error_json: Callable[[ProxyError], Mapping[str, Any]]
    """An error in the dialect's wire shape."""

    def mount(self, gateway: Gateway) -> Mounted:
        mounted: Mounted = importlib.import_module(self.routes).mount(gateway)
        if set(mounted.hot) != set(self.endpoints):
            raise ValueError(
                f"dialect {self.name.value}: {self.routes}.mount serves "
                f"{sorted(e.path for e in mounted.hot)}, its endpoints are "
                f"{sorted(e.path for e in self.endpoints)}"
            )
        return mounted

    def error_body(self, error: ProxyError) -> bytes:
        return orjson.dumps(self.error_json(error))

    def serves(self, path: str) -> bool:
        """``path`` is at or under one of the endpoints' paths (``/v1/messages``
        covers ``/v1/messages/count_tokens``): errors there take this dialect's shape."""
        return any(path.startswith(endpoint.path) for endpoint in self.endpoints)

    def owns(self, path: str) -> bool:
        """``path`` is under one of the dialect's prefix endpoints: even a method or
        a path it does not serve there is answered in its shape."""
        return any(e.prefix and path.startswith(e.path) for e in self.endpoints)
