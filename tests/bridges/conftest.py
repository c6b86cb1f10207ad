"""One Polar stack (embedded engine, rollout server, gateway node) for every bridge test;
a rollout server whose node is canned (``support.canned``) for the failed-session tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from polar.tinymodel.build import build_tiny_model

from support.bridges import BridgeStack, bridge_stack
from support.canned import CannedRollouts, mixed, mixed_task_file
from support.rollout import CONTROL_TOKEN


@pytest.fixture(scope="package")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BridgeStack]:
    yield from bridge_stack(tmp_path_factory.mktemp("bridges"))


@pytest.fixture(scope="package")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``polar model init``'s model: random Qwen3-architecture weights, the Qwen3 tokenizer."""
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-qwen3")


@pytest.fixture
def canned(tmp_path: Path) -> Iterator[CannedRollouts]:
    """Sessions end as ``support.canned.mixed`` says: scored, timed out, engine and
    preparation failures."""
    rollouts = CannedRollouts(tmp_path / "canned", mixed)
    yield rollouts
    rollouts.close()


@pytest.fixture
def canned_config(canned: CannedRollouts, tmp_path: Path) -> dict[str, Any]:
    """A bridge config (as a mapping) for the canned rollout server."""
    return {
        "rollout_url": canned.url,
        "control_token": CONTROL_TOKEN,
        "tasks": str(mixed_task_file(tmp_path / "canned-tasks")),
        "harness": {"name": "shell", "options": {"command": "true"}},
        "wait_timeout_s": 60,
    }
