"""Runtimes of each backend for the runtime tests, started in a test's directory.

A test names the *kind* of runtime it runs against: ``plain`` (local,
``sandbox: false``), ``sandbox`` (local, bubblewrap) or ``docker`` (the
``docker`` backend driving podman or docker with the image built by
:mod:`support.images`). :func:`spec_maker` skips a kind this host lacks the
tool for, with the reason; on the project's machines all three run.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from polar.runtime import GatewayAddress, Runtime, RuntimeSpec, create_runtime

LOCAL_KINDS = ("plain", "sandbox")
ALL_KINDS = (*LOCAL_KINDS, "docker")
ISOLATED_KINDS = ("sandbox", "docker")


class SpecMaker:
    """Builds the :class:`RuntimeSpec` of one kind with a test's fields."""

    def __init__(self, kind: str, container: tuple[str, str] | None = None) -> None:
        self.kind = kind
        self.container = container
        """(client binary, image reference) for ``docker``."""

    def __call__(self, **fields: Any) -> RuntimeSpec:
        if self.kind == "plain":
            fields.setdefault("network", "host")
            return RuntimeSpec(sandbox=False, **fields)
        if self.kind == "sandbox":
            return RuntimeSpec(**fields)
        assert self.container is not None
        client, image = self.container
        options = {"binary": client}
        if os.path.basename(client) == "podman" and shutil.which("runc"):
            # podman's default crun refuses hybrid cgroup hierarchies (machine notes).
            options["runtime"] = "runc"
        options.update(fields.pop("options", {}))
        return RuntimeSpec(backend="docker", image=image, options=options, **fields)


def spec_maker(kind: str, request: pytest.FixtureRequest) -> SpecMaker:
    """The spec maker of ``kind``; skips when this host cannot run it."""
    if kind == "sandbox" and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (scripts/setup --sandbox)")
    container = request.getfixturevalue("container_image") if kind == "docker" else None
    return SpecMaker(kind, container)


class Runtimes:
    """Starts runtimes below ``root`` (``s0``, ``s1``, ...); :meth:`stop_all` stops them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.started: list[Runtime] = []

    async def start(
        self, spec: RuntimeSpec, gateway: GatewayAddress | None = None, name: str | None = None
    ) -> Runtime:
        runtime = create_runtime(spec, self.root / (name or f"s{len(self.started)}"), gateway)
        self.started.append(runtime)
        await runtime.start()
        return runtime

    async def stop_all(self) -> None:
        for runtime in self.started:
            await runtime.stop()
