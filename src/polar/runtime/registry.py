"""Runtime backends by name, or any ``package.module:factory`` plug-in."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from polar.plugins import load_factory
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
    factory: RuntimeFactory = load_factory(
        spec.backend, kind="runtime", known=BACKENDS, error=UnknownRuntime
    )
    return factory(spec, session_dir, gateway)
