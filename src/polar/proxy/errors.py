"""The gateway's error tree.

Everything that can go wrong while serving a call is one of these. Each
dialect renders them in its own wire shape at one choke point (its
``routes`` module), so handlers never build error bodies by hand.
"""

from __future__ import annotations

from polar.ir import ErrorKind


class ProxyError(Exception):
    """Base class. ``status`` is the HTTP status the client should see."""

    status: int = 500
    # A stable, dialect-neutral code; dialects map it to their own ``type`` strings.
    code: str = "internal_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


# ---------------------------------------------------------------- client side


class InvalidRequest(ProxyError):
    """The request is malformed or asks for something unsupported."""

    status = 400
    code = "invalid_request_error"


class UnsupportedContent(InvalidRequest):
    """A content block or item type the gateway cannot carry to the engine."""


class BodyTooLarge(ProxyError):
    status = 413
    code = "request_too_large"


class AuthenticationFailed(ProxyError):
    status = 401
    code = "authentication_error"


class NotFound(ProxyError):
    status = 404
    code = "not_found_error"


class GatewayPaused(ProxyError):
    """The gateway stayed paused (weight sync) longer than a call may wait."""

    status = 503
    code = "overloaded_error"


class WorkerUnavailable(ProxyError):
    """The gateway worker that serves the session is not running (``--workers N``:
    it is being restarted)."""

    status = 503
    code = "worker_unavailable"


class StoreUnavailable(ProxyError):
    """The record store cannot write: the call is refused rather than served unrecorded."""

    status = 503
    code = "store_unavailable"


# ---------------------------------------------------------------- engine side


class EngineError(ProxyError):
    """The inference engine failed. Recorded on the call's record with ``kind``."""

    status = 502
    code = "engine_error"
    kind: ErrorKind = ErrorKind.ENGINE_PROTOCOL
    # Safe to retry when nothing of the reply has reached the client yet.
    retryable: bool = False
    # Whether a retry waits first (not for a pooled connection found closed).
    backoff: bool = True


class EngineHTTPError(EngineError):
    """The engine answered with an HTTP error status."""

    kind = ErrorKind.ENGINE_HTTP

    def __init__(self, message: str, *, upstream_status: int, param: str | None = None) -> None:
        super().__init__(message, param=param)
        self.upstream_status = upstream_status
        # A 4xx from the engine is about the request (context too long, bad
        # parameter): pass the status on. 5xx becomes 502 (bad gateway).
        if 400 <= upstream_status < 500:
            self.status = upstream_status
            self.code = "invalid_request_error"
        self.retryable = upstream_status in (502, 503)


class EngineTimeout(EngineError):
    status = 504
    code = "timeout_error"
    kind = ErrorKind.ENGINE_TIMEOUT


class EngineUnavailable(EngineError):
    """The engine could not be reached (connection refused, reset before any reply)."""

    status = 502
    kind = ErrorKind.ENGINE_UNAVAILABLE
    retryable = True

    def __init__(self, message: str, *, backoff: bool = True, param: str | None = None) -> None:
        super().__init__(message, param=param)
        self.backoff = backoff


class EngineProtocolError(EngineError):
    """The engine answered something this gateway cannot read."""

    kind = ErrorKind.ENGINE_PROTOCOL
