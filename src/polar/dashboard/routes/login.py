"""The login form, logging in and out, and the health check: the routes open
to everyone.

Logging in with the control token sets the session cookie (``HttpOnly``,
``SameSite=Strict``); a dashboard that asks no token sends the form to ``/``.
"""

from __future__ import annotations

from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from polar.dashboard import pages
from polar.dashboard.errors import BadRequest
from polar.dashboard.routes.guard import COOKIE, dashboard_of, params

MAX_LOGIN_BYTES = 4096


async def login_form(request: Request) -> Response:
    try:
        params(request)
    except BadRequest as exc:  # the login form takes no query
        return HTMLResponse(pages.error(exc.status, exc.message), exc.status)
    if not dashboard_of(request).needs_token:
        return RedirectResponse("/", status_code=303)
    return HTMLResponse(pages.login())


async def login(request: Request) -> Response:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_LOGIN_BYTES:
            return HTMLResponse(pages.login("The form is too large."), 413)
    try:
        form = parse_qs(body.decode("ascii"), max_num_fields=4)
    except (UnicodeDecodeError, ValueError):
        return HTMLResponse(pages.login("The form could not be read."), 400)
    given = (form.get("token") or [""])[0]
    dashboard = dashboard_of(request)
    if not dashboard.needs_token:
        return RedirectResponse("/", status_code=303)
    if not dashboard.token_matches(given):
        return HTMLResponse(pages.login("Wrong token."), 401)
    reply = RedirectResponse("/", status_code=303)
    reply.set_cookie(COOKIE, dashboard.session_cookie, httponly=True, samesite="strict", path="/")
    return reply


async def logout(request: Request) -> Response:
    reply = RedirectResponse("/login", status_code=303)
    reply.delete_cookie(COOKIE, path="/")
    return reply


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})
