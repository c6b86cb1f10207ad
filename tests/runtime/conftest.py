"""Fixtures of the runtime tests (the helpers live in :mod:`support.runtimes`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from support import images
from support.runtimes import Runtimes


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def container_image() -> tuple[str, str]:
    """(client binary, image reference) for the docker backend, built once and cached."""
    client = images.find_client()
    if client is None:
        pytest.skip("no container engine answers here (podman, or docker with a daemon)")
    try:
        return client, images.ensure_image(client)
    except images.ImageUnavailable as exc:
        pytest.skip(f"the docker runtime's test image cannot be built here: {exc}")


@pytest.fixture
async def runtimes(tmp_path: Path) -> AsyncIterator[Runtimes]:
    """Start runtimes in the test's directory; all are stopped after the test."""
    started = Runtimes(tmp_path)
    try:
        yield started
    finally:
        await started.stop_all()
