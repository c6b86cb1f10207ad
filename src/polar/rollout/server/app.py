"""The rollout server's HTTP API, over a :class:`RolloutServer`.

``POST /tasks`` submits a task (answered with its view and, once, its read
token); ``GET /tasks[?status=]`` lists them; ``GET /tasks/{id}`` is one view,
``GET /tasks/{id}/result[?wait=s]`` its result (202 with the view while it
runs), ``POST /tasks/{id}/cancel`` cancels it, ``GET /tasks/{id}/events`` and
``GET /events`` stream events (SSE). Nodes register, beat and drain under
``/nodes``; ``GET /gateways`` lists their gateways with their admin tokens
(what a trainer's weight sync needs). Nodes deliver results to ``POST
/callbacks/sessions`` and fetch the tasks' packed files from ``GET
/files/{sha256}`` (:mod:`polar.rollout.files`).

**Credentials.** Every route but ``/health`` wants the control token; the
routes that read one task (its view, result and events) also take that task's
own read token, handed out once in the answer to its submission (stored as a
SHA-256 digest). Callbacks carry no token: their body is signed
(:mod:`polar.rollout.callbacks`).

**Errors.** The domain refuses with the typed errors of
:mod:`polar.rollout.server.errors`; :data:`ANSWERS` gives each its status and type, at
one choke point (the app's exception handler). Every answer, those of this
module's own checks (tokens, queries, bodies) included, is
``{"error": {"type", "message"}}``.

The handlers reach the server through ``request.app.state.server``; it starts
and stops with the app (its lifespan).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from polar.rollout.http import (
    ApiError,
    Handler,
    answered,
    bearer,
    body_of,
    error_response,
    guarded,
    model_response,
    not_found,
    token_matches,
)
from polar.rollout.protocol import (
    NodeHeartbeat,
    NodeRegistration,
    SessionResult,
    TaskStatus,
    TaskSubmission,
)
from polar.rollout.server.errors import (
    InvalidResult,
    InvalidSubmission,
    NodeUnknown,
    RolloutServerError,
    SessionUnknown,
    TaskExists,
    TaskNotFound,
)
from polar.rollout.server.service import RolloutServer

MAX_WAIT_S = 300.0
"""The longest ``?wait=`` a result request may hold its connection."""

ANSWERS: dict[type[RolloutServerError], tuple[int, str]] = {
    TaskNotFound: (404, "not_found"),
    TaskExists: (409, "conflict"),
    InvalidSubmission: (422, "invalid_request"),
    NodeUnknown: (404, "not_found"),
    SessionUnknown: (404, "invalid_request"),  # the type this answer has always had
    InvalidResult: (422, "invalid_request"),
}
"""Each domain error's HTTP status and error type."""


def create_server_app(server: RolloutServer) -> Starlette:
    token = server.config.control_token

    def control(path: str, handler: Handler, method: str) -> Route:
        return Route(path, guarded(token, handler), methods=[method])

    def read(path: str, handler: Handler) -> Route:
        """For the control token, or the read token of the task in the path."""
        return Route(path, answered(handler, _reader), methods=["GET"])

    app = Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            control("/tasks", submit, "POST"),
            control("/tasks", listing, "GET"),
            read("/tasks/{task_id}", one),
            read("/tasks/{task_id}/result", result),
            control("/tasks/{task_id}/cancel", cancel, "POST"),
            read("/tasks/{task_id}/events", task_events),
            control("/events", all_events, "GET"),
            control("/nodes", nodes, "GET"),
            control("/gateways", gateways, "GET"),
            control("/nodes/register", register, "POST"),
            control("/nodes/{node_id}/heartbeat", heartbeat, "POST"),
            control("/nodes/{node_id}/drain", drain, "POST"),
            control("/callbacks/sessions", session_result, "POST"),
            control("/files/{digest}", task_file, "GET"),
        ],
        exception_handlers={404: not_found, RolloutServerError: refused},
        lifespan=_lifespan,
    )
    app.state.server = server
    return app


@contextlib.asynccontextmanager
async def _lifespan(app: Starlette) -> AsyncIterator[None]:
    server: RolloutServer = app.state.server
    await server.start()
    try:
        yield
    finally:
        await server.stop()


async def refused(request: Request, exc: Exception) -> Response:
    """The one place a domain error becomes an HTTP answer."""
    assert isinstance(exc, RolloutServerError)
    status, kind = ANSWERS[type(exc)]
    return error_response(ApiError(status, str(exc), kind))


def _server(request: Request) -> RolloutServer:
    server: RolloutServer = request.app.state.server
    return server


def _reader(request: Request) -> None:
    """The control token, or the read token of the task in the path."""
    given = bearer(request)
    server = _server(request)
    if token_matches(given, server.config.control_token):
        return
    if server.may_read(request.path_params.get("task_id", ""), given):
        return
    raise ApiError(401, "missing or wrong token", "unauthorized")


def _task_id(request: Request) -> str:
    task_id: str = request.path_params["task_id"]
    if _server(request).store.task(task_id) is None:
        raise TaskNotFound(task_id)
    return task_id


# ---------------------------------------------------------------- tasks


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def submit(request: Request) -> Response:
    server = _server(request)
    task_id, access = await server.submit(await body_of(request, TaskSubmission))
    view = server.store.view(task_id)
    assert view is not None
    return model_response(view.model_copy(update={"access_token": access}), 201)


async def listing(request: Request) -> Response:
    server = _server(request)
    status = request.query_params.get("status")
    try:
        wanted = TaskStatus(status) if status else None
    except ValueError:
        raise ApiError(400, f"unknown status {status!r}") from None
    rows = server.store.tasks(status=wanted)
    views = [server.store.view(task.task_id) for task in rows]
    return JSONResponse([view.model_dump(mode="json") for view in views if view is not None])


async def one(request: Request) -> Response:
    view = _server(request).store.view(_task_id(request))
    assert view is not None
    return model_response(view)


async def result(request: Request) -> Response:
    server = _server(request)
    task_id = _task_id(request)
    raw_wait = request.query_params.get("wait", "0")
    try:
        wait = float(raw_wait)
    except ValueError:
        raise ApiError(400, f"wait must be a number of seconds, not {raw_wait!r}") from None
    if not 0 <= wait <= MAX_WAIT_S:
        raise ApiError(400, f"wait must be between 0 and {MAX_WAIT_S:g} seconds")
    if not await server.wait_finished(task_id, wait):
        view = server.store.view(task_id)
        assert view is not None
        return model_response(view, 202)
    outcome = server.store.result(task_id)
    assert outcome is not None
    return model_response(outcome)


async def cancel(request: Request) -> Response:
    server = _server(request)
    task_id = _task_id(request)
    await server.cancel_task(task_id)
    view = server.store.view(task_id)
    assert view is not None
    return model_response(view)


def _events(request: Request, task_id: str | None) -> Response:
    stream: AsyncIterator[bytes] = _server(request).events.stream(
        task_id, until_finished=task_id is not None
    )
    return StreamingResponse(
        stream,
        media_type="text/event-stream",
        headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
    )


async def task_events(request: Request) -> Response:
    return _events(request, _task_id(request))


async def all_events(request: Request) -> Response:
    return _events(request, None)


# ---------------------------------------------------------------- nodes


async def register(request: Request) -> Response:
    _server(request).register(await body_of(request, NodeRegistration))
    return JSONResponse({"status": "registered"})


async def heartbeat(request: Request) -> Response:
    beat = await body_of(request, NodeHeartbeat)
    return model_response(_server(request).heartbeat(request.path_params["node_id"], beat))


async def drain(request: Request) -> Response:
    undo = request.query_params.get("undo", "false").lower() in ("1", "true", "yes")
    return model_response(_server(request).drain(request.path_params["node_id"], not undo))


async def nodes(request: Request) -> Response:
    views = _server(request).nodes.views()
    return JSONResponse([view.model_dump(mode="json") for view in views])


async def gateways(request: Request) -> Response:
    """The nodes' gateways and their admin tokens: what a trainer's weight
    sync needs (``weight_sync.gateways`` left out of its config)."""
    listed = _server(request).nodes.gateways()
    return JSONResponse([gateway.model_dump(mode="json") for gateway in listed])


async def session_result(request: Request) -> Response:
    _server(request).accept_result(await body_of(request, SessionResult))
    return JSONResponse({"status": "stored"})


async def task_file(request: Request) -> Response:
    path = _server(request).files.path(request.path_params["digest"])
    if path is None:
        raise ApiError(404, f"no task file {request.path_params['digest'][:80]}", "not_found")
    return FileResponse(path, media_type="application/x-tar")
