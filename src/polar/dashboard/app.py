"""The dashboard's HTTP app (Starlette), built from a :class:`DashboardConfig`.

**Access.** Everything but ``/login``, ``/health`` and the static files wants the
rollout server's control token: as ``Authorization: Bearer`` (scripts), or as
the session cookie the login form sets (an HMAC of the token, never the token
itself; ``HttpOnly``, ``SameSite=Strict``). Pages without it redirect to the
login form; the API and fragments answer 401. A dashboard given no token (no
rollout server, a loopback address: see :class:`DashboardConfig`) asks none.

**The one write** is ``POST /api/tasks/{id}/cancel``, which also wants the
``x-polar-dashboard`` header: a cross-site form cannot set one, and the app
answers no CORS preflight, so another site cannot cancel through a logged-in
browser.

**Input.** Unknown ids are 404 (a page, or ``{"error": ...}`` under ``/api``),
unknown or malformed query parameters 400. Every response carries a
Content-Security-Policy that allows only the dashboard's own script and style.

**Layout.** The app holds one :class:`~polar.dashboard.service.DashboardService`
(``app.state.dashboard``: the state, the token check, the rollout server's
client, the trajectory rebuilds, the event relay); the handlers are module-level
functions in :mod:`polar.dashboard.routes` that reach it through the request.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from polar.dashboard import pages
from polar.dashboard.config import DashboardConfig
from polar.dashboard.routes import routes
from polar.dashboard.routes.guard import json_error
from polar.dashboard.service import DashboardService
from polar.tokenizer import Tokenizer

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]


def create_dashboard_app(config: DashboardConfig, tokenizer: Tokenizer) -> Starlette:
    """The app; ``tokenizer`` is the model's (it decodes tokens and gives the
    chat-template facts the builders need)."""
    dashboard = DashboardService(config, tokenizer)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await dashboard.start()
        try:
            yield
        finally:
            await dashboard.stop()

    app = Starlette(routes=routes(), exception_handlers={404: _not_found}, lifespan=lifespan)
    app.state.dashboard = dashboard
    app.add_middleware(_Secured)
    return app


async def _not_found(request: Request, exc: Exception) -> Response:
    message = f"{request.method} {request.url.path}: no such page"
    if request.url.path.startswith(("/api/", "/fragments/")):
        return json_error(404, message, "not_found")
    return HTMLResponse(pages.error(404, message), 404)


class _Secured:
    """Adds the security headers to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, sending)
