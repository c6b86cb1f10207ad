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

The server starts and stops with the app (its lifespan).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from polar.rollout.files import FilesError
from polar.rollout.http import (
    ApiError,
    answered,
    bearer,
    body_of,
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
from polar.rollout.server import RolloutServer

MAX_WAIT_S = 300.0
"""The longest ``?wait=`` a result request may hold its connection."""


def create_server_app(server: RolloutServer) -> Starlette:
    token = server.config.control_token

    def reader(request: Request) -> None:
        """The control token, or the read token of the task in the path."""
        given = bearer(request)
        if token_matches(given, token):
            return
        if server.may_read(request.path_params.get("task_id", ""), given):
            return
        raise ApiError(401, "missing or wrong token", "unauthorized")

    def task_id_of(request: Request) -> str:
        task_id: str = request.path_params["task_id"]
        if server.store.task(task_id) is None:
            raise ApiError(404, f"no task {task_id}", "not_found")
        return task_id

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def submit(request: Request) -> Response:
        submission = await body_of(request, TaskSubmission)
        try:  # pack the task's host paths for nodes that do not share them
            task = await asyncio.to_thread(server.files.ship, submission.task)
        except FilesError as exc:
            raise ApiError(422, str(exc)) from None
        task_id, access = server.submit(submission.model_copy(update={"task": task}))
        view = server.store.view(task_id)
        assert view is not None
        return model_response(view.model_copy(update={"access_token": access}), 201)

    async def listing(request: Request) -> Response:
        status = request.query_params.get("status")
        try:
            wanted = TaskStatus(status) if status else None
        except ValueError:
            raise ApiError(400, f"unknown status {status!r}") from None
        rows = server.store.tasks(status=wanted)
        views = [server.store.view(task.task_id) for task in rows]
        return JSONResponse([view.model_dump(mode="json") for view in views if view is not None])

    async def one(request: Request) -> Response:
        view = server.store.view(task_id_of(request))
        assert view is not None
        return model_response(view)

    async def result(request: Request) -> Response:
        task_id = task_id_of(request)
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
        task_id = task_id_of(request)
        await server.cancel_task(task_id)
        view = server.store.view(task_id)
        assert view is not None
        return model_response(view)

    def events_response(task_id: str | None) -> Response:
        stream: AsyncIterator[bytes] = server.events.stream(
            task_id, until_finished=task_id is not None
        )
        return StreamingResponse(
            stream,
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )

    async def task_events(request: Request) -> Response:
        return events_response(task_id_of(request))

    async def all_events(request: Request) -> Response:
        return events_response(None)

    async def register(request: Request) -> Response:
        server.register(await body_of(request, NodeRegistration))
        return JSONResponse({"status": "registered"})

    async def heartbeat(request: Request) -> Response:
        beat = await body_of(request, NodeHeartbeat)
        return model_response(server.heartbeat(request.path_params["node_id"], beat))

    async def drain(request: Request) -> Response:
        undo = request.query_params.get("undo", "false").lower() in ("1", "true", "yes")
        return model_response(server.drain(request.path_params["node_id"], not undo))

    async def nodes(request: Request) -> Response:
        views = [server.node_view(node) for node in server.nodes.values()]
        return JSONResponse([view.model_dump(mode="json") for view in views])

    async def gateways(request: Request) -> Response:
        """The nodes' gateways and their admin tokens: what a trainer's weight
        sync needs (``weight_sync.gateways`` left out of its config)."""
        return JSONResponse([g.model_dump(mode="json") for g in server.gateways()])

    async def task_file(request: Request) -> Response:
        path = server.files.path(request.path_params["digest"])
        if path is None:
            raise ApiError(404, f"no task file {request.path_params['digest'][:80]}", "not_found")
        return FileResponse(path, media_type="application/x-tar")

    async def session_result(request: Request) -> Response:
        server.accept_result(await body_of(request, SessionResult))
        return JSONResponse({"status": "stored"})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await server.start()
        try:
            yield
        finally:
            await server.stop()

    def control_route(path: str, handler: object, method: str) -> Route:
        return Route(path, guarded(token, handler), methods=[method])  # type: ignore[arg-type]

    def read(path: str, handler: object) -> Route:
        return Route(path, answered(handler, reader), methods=["GET"])  # type: ignore[arg-type]

    return Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            control_route("/tasks", submit, "POST"),
            control_route("/tasks", listing, "GET"),
            read("/tasks/{task_id}", one),
            read("/tasks/{task_id}/result", result),
            control_route("/tasks/{task_id}/cancel", cancel, "POST"),
            read("/tasks/{task_id}/events", task_events),
            control_route("/events", all_events, "GET"),
            control_route("/nodes", nodes, "GET"),
            control_route("/gateways", gateways, "GET"),
            control_route("/nodes/register", register, "POST"),
            control_route("/nodes/{node_id}/heartbeat", heartbeat, "POST"),
            control_route("/nodes/{node_id}/drain", drain, "POST"),
            control_route("/callbacks/sessions", session_result, "POST"),
            control_route("/files/{digest}", task_file, "GET"),
        ],
        exception_handlers={404: not_found},
        lifespan=lifespan,
    )
