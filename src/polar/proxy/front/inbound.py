"""Reading what a client sent: API keys, size-limited JSON bodies, validation.

Every dialect uses these, so every dialect rejects bad input the same way
(and each renders the resulting :class:`~polar.proxy.errors.ProxyError` in
its own wire shape).

A body is checked against :class:`BodyLimits` right after it is decoded,
before anything else reads it: nesting depth (orjson reads 1,024 levels but
writes 255, templates and ``repr`` recurse: the limit keeps every later stage
well inside what it handles), string length, items per array or object, and
the number of messages and tools. A body over a limit is a 400 naming where
and which limit; nothing else happens.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qs

import orjson
from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from polar.bearer import bearer_token
from polar.proxy.errors import BodyTooLarge, InvalidRequest

M = TypeVar("M", bound=BaseModel)


RawHeaders = Iterable[tuple[bytes, bytes]]
"""A request's header fields as its server parsed them, in order, names in lower
case (ASGI's ``scope["headers"]``, Starlette's ``Headers.raw``)."""

_CREDENTIALS = (b"authorization", b"x-api-key", b"x-goog-api-key")


def credentials(raw: RawHeaders) -> dict[bytes, str]:
    """The credential headers given (``Authorization``, ``x-api-key``,
    ``x-goog-api-key``), by name. One sent twice is refused
    (:class:`InvalidRequest`, 400): which one would count is a guess the gateway
    does not make (it used to take the last)."""
    found: dict[bytes, str] = {}
    for name, value in raw:
        if name in _CREDENTIALS:
            if name in found:
                raise InvalidRequest(
                    f"the request has more than one '{name.decode()}' header: send one key, once"
                )
            found[name] = value.decode("latin-1")
    return found


def bearer_of(raw: RawHeaders) -> str | None:
    """The token of ``Authorization: Bearer <token>`` (the admin API's only way)."""
    return _bearer(credentials(raw).get(b"authorization"))


def api_key_of(raw: RawHeaders, query: bytes = b"") -> str | None:
    """A session's key: ``Authorization: Bearer`` (OpenAI), ``x-api-key``
    (Anthropic), ``x-goog-api-key`` or the query's ``key`` (Gemini), the first of
    these given."""
    found = credentials(raw)
    bearer = _bearer(found.get(b"authorization"))
    if bearer is not None:
        return bearer
    for name in (b"x-api-key", b"x-goog-api-key"):
        key = found.get(name)
        if key and key.strip():
            return key.strip()
    if b"key=" in query:
        for value in parse_qs(query.decode("latin-1")).get("key", ()):
            if value.strip():
                return value.strip()
    return None


def _bearer(auth: str | None) -> str | None:
    """A non-empty Bearer token in ``auth``, if any."""
    return (bearer_token(auth) or None) if auth else None


@dataclass(frozen=True, slots=True)
class BodyLimits:
    depth: int = 64
    string_chars: int = 4 << 20
    array_items: int = 16384
    messages: int = 10000
    tools: int = 1024


def json_object(raw: bytes, limits: BodyLimits | None = None) -> dict[str, Any]:
    """Decode a request body that must be a JSON object within ``limits``."""
    if not raw:
        raise InvalidRequest("request body is empty; expected a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest(f"request body must be a JSON object, not {type(body).__name__}")
    check_structure(body, limits or BodyLimits())
    return body


def check_counts(body: Mapping[str, Any], limits: BodyLimits, *, messages_field: str) -> None:
    """The number of messages (or input items) and tools of a model request."""
    for field, most, what, setting in (
        (messages_field, limits.messages, "messages", "max_messages"),
        ("tools", limits.tools, "tools", "max_tools"),
    ):
        value = body.get(field)
        if isinstance(value, list) and len(value) > most:
            raise InvalidRequest(
                f"{field}: {len(value)} {what}, more than this gateway accepts ({most}; "
                f"limits.{setting})",
                param=field,
            )


def check_structure(body: dict[str, Any], limits: BodyLimits) -> None:
    """Depth, string lengths and container sizes of a decoded body (no recursion)."""
    stack: list[tuple[Any, int, tuple[str | int, ...]]] = [(body, 1, ())]
    while stack:
        node, depth, path = stack.pop()
        if depth > limits.depth:
            _too_much(path, f"nested deeper than {limits.depth} levels (limits.max_json_depth)")
        size = len(node)
        if size > limits.array_items:
            _too_much(
                path,
                f"holds {size} items, more than {limits.array_items} (limits.max_array_items)",
            )
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            if isinstance(key, str) and len(key) > limits.string_chars:
                _too_much(path, f"has a key longer than {limits.string_chars} characters")
            if isinstance(value, str):
                if len(value) > limits.string_chars:
                    _too_much(
                        (*path, key),
                        f"is a string of {len(value)} characters, more than "
                        f"{limits.string_chars} (limits.max_string_chars)",
                    )
            elif isinstance(value, (dict, list)):
                stack.append((value, depth + 1, (*path, key)))


def _too_much(path: tuple[str | int, ...], what: str) -> None:
    where = ".".join(str(p)[:64] for p in path[:12]) or "body"
    if len(path) > 12:
        where += "..."
    raise InvalidRequest(f"{where}: {what}", param=where)


async def read_json_object(
    request: Request, limit: int, limits: BodyLimits | None = None
) -> dict[str, Any]:
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
    return json_object(b"".join(chunks), limits)


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
