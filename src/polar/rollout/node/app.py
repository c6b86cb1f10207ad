"""A gateway node's API, on its own port, apart from the gateway's.

The gateway's port is what sandboxes reach (through their relay); this API
must be out of their reach, so it listens elsewhere (``control_host:
control_port``) and every route but ``/health`` wants the control token.

``POST /node/sessions`` takes a :class:`SessionDispatch` (idempotent per
session id) if the node's policy allows what it asks for (403 otherwise);
``GET /node/sessions[/{id}]`` reports statuses and finished results;
``POST /node/sessions/{id}/cancel`` kills a session; ``DELETE
/node/sessions/{id}`` acknowledges a finished one (the node forgets it);
``GET /node/health`` reports the node's load.

The node itself starts and stops with its gateway (an :class:`Extension` of
the gateway's app, with no routes), since it needs the gateway running.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from polar.proxy.app import Extension
from polar.rollout.http import ApiError, body_of, guarded, not_found
from polar.rollout.node.lifecycle import NodeSession
from polar.rollout.node.policy import PolicyViolation
from polar.rollout.node.service import DispatchConflict, Node, NotStarted
from polar.rollout.protocol import SessionDispatch
from polar.runtime.base import GatewayAddress


def session_json(session: NodeSession) -> dict[str, object]:
    return {
        "session_id": session.id,
        "task_id": session.dispatch.task_id,
        "status": session.status.value,
        "result": session.result.model_dump(mode="json") if session.result is not None else None,
    }


def node_extension(node: Node, address: Callable[[], GatewayAddress]) -> Extension:
    """The node's life, tied to its gateway's (``address``: where the gateway listens)."""

    async def start() -> None:
        await node.start(address())

    return Extension(routes=(), start=start, stop=node.stop)


def create_node_app(node: Node) -> Starlette:
    """The node's API (see the module docstring)."""
    token = node.config.control_token

    def held(request: Request) -> NodeSession:
        sid = request.path_params["session_id"]
        session = node.sessions.get(sid)
        if session is None:
            raise ApiError(404, f"no session {sid} on node {node.config.node_id}", "not_found")
        return session

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def load(request: Request) -> Response:
        return JSONResponse(
            {
                "node_id": node.config.node_id,
                "capacity": node.config.capacity.model_dump(),
                "sessions": node.load(),
            }
        )

    async def dispatch(request: Request) -> Response:
        asked = await body_of(request, SessionDispatch)
        try:
            session = node.dispatch(asked)
        except PolicyViolation as exc:
            raise ApiError(403, str(exc), "forbidden") from None
        except DispatchConflict as exc:
            raise ApiError(409, str(exc), "conflict") from None
        except NotStarted as exc:
            raise ApiError(503, str(exc), "unavailable") from None
        return JSONResponse(session_json(session), status_code=202)

    async def listing(request: Request) -> Response:
        return JSONResponse({sid: session.status.value for sid, session in node.sessions.items()})

    async def one(request: Request) -> Response:
        return JSONResponse(session_json(held(request)))

    async def cancel(request: Request) -> Response:
        session = held(request)
        await node.cancel(session.id)
        return JSONResponse(session_json(session))

    async def forget(request: Request) -> Response:
        session = held(request)
        if not node.forget(session.id):
            raise ApiError(409, f"session {session.id} is still {session.status.value}", "conflict")
        return Response(status_code=204)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield

    return Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/node/health", guarded(token, load), methods=["GET"]),
            Route("/node/sessions", guarded(token, dispatch), methods=["POST"]),
            Route("/node/sessions", guarded(token, listing), methods=["GET"]),
            Route("/node/sessions/{session_id}", guarded(token, one), methods=["GET"]),
            Route("/node/sessions/{session_id}", guarded(token, forget), methods=["DELETE"]),
            Route("/node/sessions/{session_id}/cancel", guarded(token, cancel), methods=["POST"]),
        ],
        exception_handlers={404: not_found, 405: not_found},
        lifespan=lifespan,
    )
