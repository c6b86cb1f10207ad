"""What the rollout server's and the node's HTTP APIs share: bearer-token
auth, one error shape, and validated JSON bodies.

Tokens are compared as bytes in constant time (``hmac.compare_digest``), so a
header with characters outside ASCII is a wrong token (401), never an error.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from polar.bearer import bearer_token
from polar.configfile import describe_error

M = TypeVar("M", bound=BaseModel)


class ApiError(Exception):
    """Answered as ``{"error": {"type": kind, "message": message}}`` with ``status``."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


def error_response(error: ApiError) -> Response:
    return JSONResponse(
        {"error": {"type": error.kind, "message": error.message}}, status_code=error.status
    )


def bearer(request: Request) -> bytes | None:
    """The request's ``Authorization: Bearer`` token as sent (bytes), if any."""
    raw = next((value for key, value in request.scope["headers"] if key == b"authorization"), None)
    return None if raw is None else bearer_token(raw)


def token_matches(given: bytes | None, token: str) -> bool:
    return given is not None and hmac.compare_digest(given, token.encode())


def check_token(request: Request, token: str) -> None:
    """Refuse the request unless it carries ``Authorization: Bearer <token>``."""
    if not token_matches(bearer(request), token):
        raise ApiError(401, "missing or wrong control token", "unauthorized")


async def body_of(request: Request, model: type[M]) -> M:
    """The request's JSON body validated as ``model`` (400 with one line otherwise)."""
    raw = await request.body()
    try:
        data: Any = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ApiError(400, "the body is not valid JSON") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ApiError(422, describe_error(exc)) from None


async def not_found(request: Request, exc: Exception) -> Response:
    """The 404 handler: the shared error shape, naming the method and path."""
    return JSONResponse(
        {"error": {"type": "not_found", "message": f"{request.method} {request.url.path}"}},
        status_code=404,
    )


def model_response(model: BaseModel, status: int = 200) -> Response:
    return Response(model.model_dump_json(), status_code=status, media_type="application/json")


Handler = Callable[[Request], Awaitable[Response]]


def guarded(token: str, handler: Handler) -> Handler:
    """``handler`` behind the control token, with :class:`ApiError` answered."""
    return answered(handler, lambda request: check_token(request, token))


def answered(handler: Handler, check: Callable[[Request], None] | None = None) -> Handler:
    """``handler`` with :class:`ApiError` answered, after ``check`` (which may raise it)."""

    async def endpoint(request: Request) -> Response:
        try:
            if check is not None:
                check(request)
            return await handler(request)
        except ApiError as exc:
            return error_response(exc)

    return endpoint
