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
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from typing import Any
from urllib.parse import parse_qs

import orjson
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from polar.bearer import bearer_token
from polar.dashboard import pages, training
from polar.dashboard.config import DashboardConfig
from polar.dashboard.sources import (
    RecordSource,
    RolloutSource,
    SourceError,
    read_metrics,
    read_sft_stats,
    task_of_session,
    valid_id,
)
from polar.dashboard.tokens import Built, Trajectories, token_view
from polar.rollout.conversation import conversation_json
from polar.rollout.protocol import SessionResult, TaskStatus
from polar.trajectory import ChainClass, TrajectoryError

COOKIE = "polar_dashboard"
CSRF_HEADER = "x-polar-dashboard"
MAX_LOGIN_BYTES = 4096
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


class Unauthorized(Exception):
    pass


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


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


def create_dashboard_app(config: DashboardConfig, tokenizer: Any) -> Starlette:
    """The app; ``tokenizer`` is the model's (it decodes tokens and gives the
    chat-template facts the builders need)."""
    token = config.control_token
    session_cookie = (
        hmac.new(token.encode(), b"polar dashboard session", hashlib.sha256).hexdigest()
        if token is not None
        else ""
    )
    records = RecordSource(config.stores)
    trajectories = Trajectories(config.builder, tokenizer, capacity=config.trajectory_cache)
    build_lock = threading.Lock()
    state: dict[str, RolloutSource] = {}

    def authorized(request: Request) -> bool:
        if token is None:  # open: no server, loopback only (DashboardConfig)
            return True
        given = bearer_token(request.headers.get("authorization", ""))
        if given is not None and hmac.compare_digest(given.encode(), token.encode()):
            return True
        cookie = request.cookies.get(COOKIE, "")
        return hmac.compare_digest(cookie.encode(), session_cookie.encode())

    def rollout() -> RolloutSource | None:
        return state.get("rollout")

    Handler = Callable[[Request], Awaitable[Response]]

    def html_route(handler: Handler) -> Handler:
        async def endpoint(request: Request) -> Response:
            if not authorized(request):
                return RedirectResponse("/login", status_code=303)
            try:
                return await handler(request)
            except BadRequest as exc:
                return HTMLResponse(pages.error(exc.status, exc.message), exc.status)
            except SourceError as exc:
                return HTMLResponse(pages.error(exc.status, exc.message), exc.status)

        return endpoint

    def api_route(handler: Handler) -> Handler:
        async def endpoint(request: Request) -> Response:
            if not authorized(request):
                return _json_error(401, "missing or wrong control token", "unauthorized")
            try:
                return await handler(request)
            except BadRequest as exc:
                return _json_error(exc.status, exc.message)
            except SourceError as exc:
                return _json_error(exc.status, exc.message, "source_error")

        return endpoint

    # ------------------------------------------------------------ login

    async def login_form(request: Request) -> Response:
        params(request)
        if token is None:
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
        if token is None:
            return RedirectResponse("/", status_code=303)
        if not hmac.compare_digest(given.encode(), token.encode()):
            return HTMLResponse(pages.login("Wrong token."), 401)
        reply = RedirectResponse("/", status_code=303)
        reply.set_cookie(COOKIE, session_cookie, httponly=True, samesite="strict", path="/")
        return reply

    async def logout(request: Request) -> Response:
        reply = RedirectResponse("/login", status_code=303)
        reply.delete_cookie(COOKIE, path="/")
        return reply

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    # ------------------------------------------------------------ tasks

    def status_param(request: Request) -> TaskStatus | None:
        raw = params(request, frozenset({"status"})).get("status")
        if raw is None:
            return None
        try:
            return TaskStatus(raw)
        except ValueError:
            raise BadRequest(400, f"unknown status {raw!r}") from None

    async def tasks_html(wanted: TaskStatus | None) -> str:
        source = rollout()
        if source is None:
            return pages.tasks_fragment([], "No rollout server given (--server).")
        try:
            return pages.tasks_fragment(await source.tasks(wanted))
        except SourceError as exc:
            return pages.tasks_fragment([], exc.message)

    async def tasks_page(request: Request) -> Response:
        fragment = await tasks_html(status_param(request))
        return HTMLResponse(pages.tasks_page(fragment, live=rollout() is not None))

    async def tasks_fragment(request: Request) -> Response:
        return HTMLResponse(await tasks_html(status_param(request)))

    async def task_html(task_id: str) -> str:
        source = rollout()
        view = await source.task(task_id) if source else None
        if source is None or view is None:
            raise SourceError(404, f"no task {task_id}")
        result = await source.result(task_id) if view.status is not TaskStatus.RUNNING else None
        return pages.task_fragment(view, result)

    async def task_page(request: Request) -> Response:
        params(request)
        task_id = request.path_params["task_id"]
        return HTMLResponse(pages.task_page(task_id, await task_html(task_id)))

    async def task_fragment(request: Request) -> Response:
        params(request)
        return HTMLResponse(await task_html(request.path_params["task_id"]))

    async def tasks_api(request: Request) -> Response:
        wanted = status_param(request)
        source = rollout()
        if source is None:
            raise SourceError(404, "no rollout server given")
        views = await source.tasks(wanted)
        return JSONResponse([v.model_dump(mode="json") for v in views])

    async def cancel_api(request: Request) -> Response:
        params(request)
        if request.headers.get(CSRF_HEADER) != "1":
            raise BadRequest(403, f"cancel wants the {CSRF_HEADER} header")
        source = rollout()
        if source is None:
            raise SourceError(404, "no rollout server given")
        view = await source.cancel(request.path_params["task_id"])
        return Response(view.model_dump_json(), media_type="application/json")

    async def events_api(request: Request) -> Response:
        params(request)
        source = rollout()
        if source is None:
            raise SourceError(404, "no rollout server given")

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in source.events():
                    yield chunk
            except SourceError as exc:
                data = orjson.dumps({"message": exc.message}).decode()
                yield f"event: dashboard.error\ndata: {data}\n\n".encode()

        return StreamingResponse(
            relay(),
            media_type="text/event-stream",
            headers={"x-accel-buffering": "no"},
        )

    # ------------------------------------------------------------ sessions

    async def session_result(session_id: str) -> SessionResult | None:
        source = rollout()
        task_id = task_of_session(session_id)
        if source is None or task_id is None:
            return None
        result = await source.result(task_id)
        if result is None:
            return None
        return next((r for r in result.results if r.session_id == session_id), None)

    def built_of(session_id: str) -> Built | None:
        stored = records.find(session_id)
        if stored is None:
            return None
        found = records.records(stored)
        with build_lock:
            return trajectories.of(session_id, found)

    async def load_session(session_id: str) -> tuple[Built | None, str | None]:
        try:
            return await run_in_threadpool(built_of, session_id), None
        except TrajectoryError as exc:
            return None, f"the session's records do not build: {exc}"

    async def sessions_page(request: Request) -> Response:
        params(request)
        stored = await run_in_threadpool(records.sessions)
        return HTMLResponse(pages.sessions_page(stored))

    async def session_page(request: Request) -> Response:
        raw = params(request, frozenset({"trace"})).get("trace")
        session_id = request.path_params["session_id"]
        if not valid_id(session_id):
            raise SourceError(404, f"no session {session_id}")
        result = await session_result(session_id)
        built, problem = await load_session(session_id)
        if built is None and result is None and problem is None:
            raise SourceError(404, f"no session {session_id}")
        shown: int | None = None
        conversation = None
        if built is not None and built.trajectory.traces:
            shown = _index(raw, len(built.trajectory.traces), default=_main_last(built))
            conversation = await run_in_threadpool(
                conversation_json, built.trajectory.traces[shown], built.by_key
            )
        elif raw is not None:
            raise BadRequest(400, "this session has no traces to show")
        return HTMLResponse(
            pages.session_page(session_id, result, built, problem, conversation, shown)
        )

    async def trace_of(request: Request) -> tuple[str, Built, int]:
        params(request)
        session_id = request.path_params["session_id"]
        built, problem = await load_session(session_id)
        if problem is not None:
            raise SourceError(500, problem)
        raw = request.path_params["index"]
        if built is None:
            raise SourceError(404, f"no session {session_id} in the record stores")
        count = len(built.trajectory.traces)
        if not raw.isdigit() or int(raw) >= count:
            raise SourceError(404, f"session {session_id} has no trace {raw} (it has {count})")
        return session_id, built, int(raw)

    async def token_page(request: Request) -> Response:
        session_id, built, index = await trace_of(request)
        return HTMLResponse(pages.token_page(session_id, index, built))

    async def tokens_api(request: Request) -> Response:
        _, built, index = await trace_of(request)
        data = await run_in_threadpool(token_view, trajectories, built, index)
        return Response(orjson.dumps(data), media_type="application/json")

    # ------------------------------------------------------------ training

    def training_html() -> str:
        metrics = sft = None
        metrics_problem = sft_problem = None
        if config.metrics is not None:
            try:
                metrics = read_metrics(config.metrics)
            except SourceError as exc:
                metrics_problem = exc.message
        if config.sft is not None:
            try:
                sft = read_sft_stats(config.sft)
            except SourceError as exc:
                sft_problem = exc.message
        configured = (config.metrics is not None, config.sft is not None)
        return training.training_fragment(metrics, metrics_problem, sft, sft_problem, configured)

    async def training_page(request: Request) -> Response:
        params(request)
        return HTMLResponse(training.training_page(await run_in_threadpool(training_html)))

    async def training_fragment(request: Request) -> Response:
        params(request)
        return HTMLResponse(await run_in_threadpool(training_html))

    # ------------------------------------------------------------ the app

    async def not_found(request: Request, exc: Exception) -> Response:
        message = f"{request.method} {request.url.path}: no such page"
        if request.url.path.startswith(("/api/", "/fragments/")):
            return _json_error(404, message, "not_found")
        return HTMLResponse(pages.error(404, message), 404)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if config.server_url is not None:
            assert token is not None  # DashboardConfig asks one of a server
            state["rollout"] = RolloutSource(
                config.server_url, token, timeout_s=config.server_timeout_s
            )
        try:
            yield
        finally:
            source = state.pop("rollout", None)
            if source is not None:
                await source.aclose()

    static = StaticFiles(directory=str(resources.files("polar.dashboard") / "static"))
    app = Starlette(
        routes=[
            Route("/health", health),
            Route("/login", login_form, methods=["GET"]),
            Route("/login", login, methods=["POST"]),
            Route("/logout", logout, methods=["POST"]),
            Mount("/static", static, name="static"),
            Route("/", html_route(tasks_page)),
            Route("/tasks/{task_id}", html_route(task_page)),
            Route("/sessions", html_route(sessions_page)),
            Route("/sessions/{session_id}", html_route(session_page)),
            Route("/sessions/{session_id}/traces/{index}", html_route(token_page)),
            Route("/training", html_route(training_page)),
            Route("/fragments/tasks", api_route(tasks_fragment)),
            Route("/fragments/tasks/{task_id}", api_route(task_fragment)),
            Route("/fragments/training", api_route(training_fragment)),
            Route("/api/tasks", api_route(tasks_api)),
            Route("/api/tasks/{task_id}/cancel", api_route(cancel_api), methods=["POST"]),
            Route("/api/events", api_route(events_api)),
            Route("/api/sessions/{session_id}/traces/{index}/tokens", api_route(tokens_api)),
        ],
        exception_handlers={404: not_found},
        lifespan=lifespan,
    )
    app.add_middleware(_Secured)
    return app


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


def _json_error(status: int, message: str, kind: str = "invalid_request") -> Response:
    return JSONResponse({"error": {"type": kind, "message": message}}, status_code=status)


def _index(raw: str | None, count: int, *, default: int) -> int:
    if raw is None:
        return default
    if not raw.isdigit() or int(raw) >= count:
        raise BadRequest(400, f"trace must be a number from 0 to {count - 1}, not {raw!r}")
    return int(raw)


def _main_last(built: Built) -> int:
    """The last trace of the main chain (the agent's conversation as it ended)."""
    traces = built.trajectory.traces
    chains = built.trajectory.chains
    main = [i for i, t in enumerate(traces) if chains[t.chain].chain_class is ChainClass.MAIN]
    return main[-1] if main else len(traces) - 1
