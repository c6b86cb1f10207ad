"""One Polar stack (embedded engine, rollout server, gateway node) for every bridge test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.bridges import BridgeStack, bridge_stack


@pytest.fixture(scope="package")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BridgeStack]:
    yield from bridge_stack(tmp_path_factory.mktemp("bridges"))
