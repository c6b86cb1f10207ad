"""OpenAI's error shape, shared by the Chat Completions and Responses dialects.

``{"error": {"message", "type", "param", "code"}}`` with OpenAI's ``type``
strings: ``invalid_request_error`` for the caller's mistakes (401s carry
``code: "invalid_api_key"``), ``server_error`` for the engine's and ours.
"""

from __future__ import annotations

from typing import TypedDict

from polar.proxy.errors import (
    AuthenticationFailed,
    EngineError,
    EngineHTTPError,
    GatewayPaused,
    ProxyError,
    StoreUnavailable,
    UnsupportedContent,
    WorkerUnavailable,
)


class WireErrorBody(TypedDict):
    message: str
    type: str
    param: str | None
    code: str | None


class WireError(TypedDict):
    error: WireErrorBody


def error_json(error: ProxyError) -> WireError:
    """An error in OpenAI's shape: ``{"error": {message, type, param, code}}``."""
    kind: str
    code: str | None
    match error:
        case AuthenticationFailed():
            kind, code = "invalid_request_error", "invalid_api_key"
        case EngineHTTPError() if error.status < 500:
            kind, code = "invalid_request_error", None
        case GatewayPaused():
            kind, code = "server_error", "gateway_paused"
        case StoreUnavailable() | WorkerUnavailable():
            kind, code = "server_error", error.code
        case EngineError():
            kind, code = "server_error", error.code
        case UnsupportedContent():
            kind, code = "invalid_request_error", "unsupported_content"
        case ProxyError() if error.status < 500:
            kind, code = "invalid_request_error", None if error.status == 400 else error.code
        case _:
            kind, code = "server_error", None
    return {"error": {"message": error.message, "type": kind, "param": error.param, "code": code}}
