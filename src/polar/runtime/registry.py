"""Runtime backends by name, or any ``package.module:factory`` plug-in."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path

from polar.runtime.base import GatewayAddress, Runtime, RuntimeFactory, RuntimeSpec
from polar.runtime.errors import UnknownRuntime

BACKENDS: Mapping[str, str] = {
    "local": "polar.runtime.local:LocalRuntime",
    "docker": "polar.runtime.docker:DockerRuntime",
    "apptainer": "polar.runtime.apptainer:ApptainerRuntime",
}
"""Built-in backends: name -> dotted path of the factory."""


def create_runtime(
    spec: RuntimeSpec, session_dir: Path, gateway: GatewayAddress | None = None
) -> Runtime:
    """A new (not yet started) runtime for one session."""
    return _factory(spec.backend)(spec, session_dir, gateway)


def _factory(ref: str) -> RuntimeFactory:
    path = BACKENDS.get(ref, ref)
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise UnknownRuntime(
            f"unknown runtime {ref!r}; use one of {sorted(BACKENDS)} or 'package.module:factory'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnknownRuntime(f"runtime {ref}: cannot import {module_name} ({exc})") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise UnknownRuntime(f"runtime {ref}: {module_name} has no callable {attr!r}")
    return factory  # type: ignore[no-any-return]
