"""Admin endpoints: sessions, their records, and the weight-sync gate.

All of them need ``Authorization: Bearer <admin_token>``; errors come back as
``{"error": {"message": ..., "type": ...}}``.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from polar.ir.codec import record_to_json
from polar.proxy.call.behaviour import SamplingPolicy
from polar.proxy.errors import AuthenticationFailed, InvalidRequest, NotFound, ProxyError
from polar.proxy.front.inbound import bearer_of, read_json_object, validate
from polar.proxy.gateway import Gateway

_MAX_ADMIN_BODY = 1 << 20


class CreateSession(BaseModel):
    model_config = ConfigDict(extra="forbid")
    session_id: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    sampling: SamplingPolicy | None = None
    """Enforced on every call of the session (:mod:`polar.proxy.call.behaviour`)."""


class Pause(BaseModel):
    model_config = ConfigDict(extra="forbid")
    timeout_s: float | None = Field(default=None, gt=0)


class Resume(BaseModel):
    model_config = ConfigDict(extra="forbid")
    policy_version: int | None = Field(default=None, ge=0, le=(1 << 62))


def _error(error: ProxyError) -> Response:
    return JSONResponse(
        {"error": {"message": error.message, "type": error.code}}, status_code=error.status
    )


Handler = Callable[[Request, Gateway], Awaitable[Response]]


def _admin(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        gateway: Gateway = request.app.state.gateway
        try:
            given = bearer_of(request.headers.raw) or ""
        except ProxyError as error:
            return _error(error)
        if not hmac.compare_digest(given.encode(), gateway.config.admin_token.encode()):
            return _error(
                AuthenticationFailed(
                    "admin endpoints need the admin token as 'Authorization: Bearer <token>'"
                )
            )
        try:
            return await handler(request, gateway)
        except ProxyError as error:
            return _error(error)

    return endpoint


async def _body(request: Request) -> dict[str, Any]:
    if request.headers.get("content-length") in (None, "0"):
        return {}
    gateway: Gateway = request.app.state.gateway
    return await read_json_object(request, _MAX_ADMIN_BODY, gateway.body_limits)


def _session_json(session_id: str, gateway: Gateway) -> dict[str, Any]:
    row = gateway.store.session(session_id)
    if row is None:
        raise NotFound(f"no session {session_id!r}")
    return {
        "session_id": row.id,
        "created_at": row.created_at,
        "closed_at": row.closed_at,
        "metadata": row.metadata,
        "sampling": SamplingPolicy.of(row.sampling).model_dump() if row.sampling else None,
        "calls": row.last_seq,
    }


async def create_session(request: Request, gateway: Gateway) -> Response:
    spec = validate(CreateSession, await _body(request))
    new = await gateway.sessions.create(
        session_id=spec.session_id,
        metadata=spec.metadata,
        sampling=spec.sampling.distribution() if spec.sampling else None,
    )
    return JSONResponse(
        {
            "session_id": new.session.id,
            "api_key": new.api_key,
            "created_at": new.session.created_at,
            "metadata": new.session.metadata,
            "sampling": spec.sampling.model_dump() if spec.sampling else None,
        },
        status_code=201,
    )


async def list_sessions(request: Request, gateway: Gateway) -> Response:
    return JSONResponse(
        {
            "sessions": [
                {"session_id": s.id, "created_at": s.created_at, "calls": s.last_seq}
                for s in gateway.sessions.open_sessions()
            ]
        }
    )


async def get_session(request: Request, gateway: Gateway) -> Response:
    sid = request.path_params["session_id"]
    return JSONResponse(await asyncio.to_thread(_session_json, sid, gateway))


async def close_session(request: Request, gateway: Gateway) -> Response:
    await gateway.sessions.close(request.path_params["session_id"])
    return Response(status_code=204)


async def session_records(request: Request, gateway: Gateway) -> Response:
    sid = request.path_params["session_id"]
    fmt = request.query_params.get("format", "json")
    if fmt not in ("json", "jsonl"):
        raise InvalidRequest("format must be 'json' or 'jsonl'", param="format")
    await asyncio.to_thread(_session_json, sid, gateway)  # 404 for unknown sessions
    rows = [record_to_json(r) for r in await gateway.records(sid)]
    if fmt == "jsonl":
        text = b"".join(orjson.dumps(r) + b"\n" for r in rows)
        return Response(text, media_type="application/x-ndjson")
    return Response(orjson.dumps({"records": rows}), media_type="application/json")


async def session_stats(request: Request, gateway: Gateway) -> Response:
    sid = request.path_params["session_id"]
    await asyncio.to_thread(_session_json, sid, gateway)
    stats = await asyncio.to_thread(gateway.store.stats, sid)
    return JSONResponse(
        {
            "records": stats.records,
            "stored_bytes": stats.stored_bytes,
            "naive_bytes": stats.naive_bytes,
        }
    )


def _status(gateway: Gateway) -> dict[str, Any]:
    gate = gateway.gate.status()
    return {
        "paused": gate.paused,
        "inflight": gate.inflight,
        "waiting": gate.waiting,
        "policy_version": gate.policy_version,
        "engine": gateway.capture.engine_name,
        "model": gateway.capture.model,
        "capture": gateway.capture.mode.value,
        "open_sessions": len(gateway.sessions.open_sessions()),
    }


async def pause(request: Request, gateway: Gateway) -> Response:
    spec = validate(Pause, await _body(request))
    timeout = spec.timeout_s or gateway.config.limits.drain_timeout_s
    outcome = await gateway.gate.pause(timeout_s=timeout)
    body = {
        **_status(gateway),
        "drained": outcome.drained,
        "drained_calls": outcome.drained_calls,
        "waited_s": round(outcome.waited_s, 3),
    }
    return JSONResponse(body, status_code=200 if outcome.drained else 504)


async def resume(request: Request, gateway: Gateway) -> Response:
    spec = validate(Resume, await _body(request))
    await gateway.resume(policy_version=spec.policy_version)
    return JSONResponse(_status(gateway))


async def status(request: Request, gateway: Gateway) -> Response:
    return JSONResponse(_status(gateway))


def routes() -> list[BaseRoute]:
    return [
        Route("/admin/sessions", _admin(create_session), methods=["POST"]),
        Route("/admin/sessions", _admin(list_sessions), methods=["GET"]),
        Route("/admin/sessions/{session_id}", _admin(get_session), methods=["GET"]),
        Route("/admin/sessions/{session_id}", _admin(close_session), methods=["DELETE"]),
        Route("/admin/sessions/{session_id}/records", _admin(session_records), methods=["GET"]),
        Route("/admin/sessions/{session_id}/stats", _admin(session_stats), methods=["GET"]),
        Route("/admin/pause", _admin(pause), methods=["POST"]),
        Route("/admin/resume", _admin(resume), methods=["POST"]),
        Route("/admin/status", _admin(status), methods=["GET"]),
    ]
