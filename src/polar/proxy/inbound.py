"""Reading what a client sent: API keys, size-limited JSON bodies, validation.

Every dialect uses these, so every dialect rejects bad input the same way
(and each renders the resulting :class:`~polar.proxy.errors.ProxyError` in
its own wire shape).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from polar.proxy.errors import BodyTooLarge, InvalidRequest

M = TypeVar("M", bound=BaseModel)


def api_key_of(headers: Mapping[str, str]) -> str | None:
    """The caller's key: ``Authorization: Bearer`` (OpenAI) or ``x-api-key`` (Anthropic)."""
    auth = headers.get("authorization")
    if auth:
        scheme, _, token = auth.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    key = headers.get("x-api-key")
    return key.strip() if key else None


def json_object(raw: bytes) -> dict[str, Any]:
    """Decode a request body that must be a JSON object."""
    if not raw:
        raise InvalidRequest("request body is empty; expected a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest(f"request body must be a JSON object, not {type(body).__name__}")
    return body


async def read_json_object(request: Request, limit: int) -> dict[str, Any]:
    """A Starlette request's JSON object body, at most ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"request body of {declared} bytes exceeds the limit of {limit}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return json_object(b"".join(chunks))


def validate(model: type[M], body: dict[str, Any]) -> M:
    """Validate a wire body; the first problem becomes a 400 naming its location."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        message = "field required" if first["type"] == "missing" else first["msg"]
        more = len(exc.errors()) - 1
        suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
        raise InvalidRequest(f"{where}: {message}{suffix}", param=where or None) from None
