"""The runtime layer's errors."""

from __future__ import annotations


class RuntimeFailure(Exception):
    """Base class of runtime errors (named so it does not shadow the builtin)."""


class UnknownRuntime(RuntimeFailure):
    """No backend of that name, or a plug-in that cannot be loaded."""


class UnsupportedSpec(RuntimeFailure):
    """The backend cannot honour a setting of the spec (a limit, a network policy)."""


class RuntimeStartError(RuntimeFailure):
    """The sandbox could not be created or started."""


class RuntimeNotStarted(RuntimeFailure):
    """A command or copy was asked of a runtime that is not running."""


class CopyError(RuntimeFailure):
    """A file could not be copied into or out of the runtime."""
