"""What every dashboard handler shares: the token check, errors mapped to
answers, and strict query parameters.

A page handler's caller without the token is sent to the login form (303); an
API or fragment handler's gets a 401 in JSON. Inside, a
:class:`~polar.dashboard.errors.BadRequest` or a
:class:`~polar.dashboard.sources.SourceError` becomes an error page, or
``{"error": {"type": ..., "message": ...}}``, with their status.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from polar.dashboard import pages
from polar.dashboard.errors import BadRequest
from polar.dashboard.service import DashboardService
from polar.dashboard.sources import SourceError
from polar.rollout.protocol import TaskStatus

COOKIE = "polar_dashboard"
"""The login cookie (its value: :attr:`DashboardService.session_cookie`)."""

Handler = Callable[[Request, DashboardService], Awaitable[Response]]
Endpoint = Callable[[Request], Awaitable[Response]]


def dashboard_of(request: Request) -> DashboardService:
    service: DashboardService = request.app.state.dashboard
    return service


def authorized(request: Request) -> bool:
    return dashboard_of(request).authorized(
        request.headers.get("authorization", ""), request.cookies.get(COOKIE, "")
    )


def html_route(handler: Handler) -> Endpoint:
    """A page: the login form without the token, an error page on errors."""

    async def endpoint(request: Request) -> Response:
        if not authorized(request):
            return RedirectResponse("/login", status_code=303)
        try:
            return await handler(request, dashboard_of(request))
        except BadRequest as exc:
            return HTMLResponse(pages.error(exc.status, exc.message), exc.status)
        except SourceError as exc:
            return HTMLResponse(pages.error(exc.status, exc.message), exc.status)

    return endpoint


def api_route(handler: Handler) -> Endpoint:
    """JSON or a fragment: 401 without the token, a JSON error on errors."""

    async def endpoint(request: Request) -> Response:
        if not authorized(request):
            return json_error(401, "missing or wrong control token", "unauthorized")
        try:
            return await handler(request, dashboard_of(request))
        except BadRequest as exc:
            return json_error(exc.status, exc.message)
        except SourceError as exc:
            return json_error(exc.status, exc.message, "source_error")

    return endpoint


def json_error(status: int, message: str, kind: str = "invalid_request") -> Response:
    return JSONResponse({"error": {"type": kind, "message": message}}, status_code=status)


def params(request: Request, allowed: frozenset[str] = frozenset()) -> dict[str, str]:
    """The query parameters, each at most once and each one ``allowed`` (else 400)."""
    seen: dict[str, str] = {}
    for key, value in request.query_params.multi_items():
        if key not in allowed:
            raise BadRequest(400, f"unknown query parameter {key!r}")
        if key in seen:
            raise BadRequest(400, f"query parameter {key!r} given twice")
        seen[key] = value
    return seen


def status_param(request: Request) -> TaskStatus | None:
    """The task list's one parameter, ``status`` (400 if it names no status)."""
    raw = params(request, frozenset({"status"})).get("status")
    if raw is None:
        return None
    try:
        return TaskStatus(raw)
    except ValueError:
        raise BadRequest(400, f"unknown status {raw!r}") from None
