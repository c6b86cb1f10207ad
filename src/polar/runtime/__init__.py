"""Sandboxes a session's commands run in (see :mod:`polar.runtime.base`)."""

from polar.runtime.base import (
    ExecResult,
    GatewayAddress,
    Mount,
    NetworkPolicy,
    Runtime,
    RuntimeFactory,
    RuntimeSpec,
)
from polar.runtime.errors import (
    CopyError,
    RuntimeFailure,
    RuntimeNotStarted,
    RuntimeStartError,
    UnknownRuntime,
    UnsupportedSpec,
)
from polar.runtime.registry import BACKENDS, create_runtime

__all__ = [
    "BACKENDS",
    "CopyError",
    "ExecResult",
    "GatewayAddress",
    "Mount",
    "NetworkPolicy",
    "Runtime",
    "RuntimeFactory",
    "RuntimeFailure",
    "RuntimeNotStarted",
    "RuntimeSpec",
    "RuntimeStartError",
    "UnknownRuntime",
    "UnsupportedSpec",
    "create_runtime",
]
