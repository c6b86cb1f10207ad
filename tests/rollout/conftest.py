"""Fixtures for the rollout service tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from polar.harness import load_harness

from support.rollout import HARNESS_CACHE, RolloutStack


@pytest.fixture
def make_rollout(tmp_path: Path, tokenizer: Any) -> Iterator[Callable[..., RolloutStack]]:
    """Start whole rollout services (engine, server, node); all stopped after the test."""
    stacks: list[RolloutStack] = []

    def make(script: dict[str, Any], **options: Any) -> RolloutStack:
        stack = RolloutStack(tmp_path / f"rollout{len(stacks)}", tokenizer, script, **options)
        stacks.append(stack)
        return stack

    yield make
    for stack in stacks:
        stack.close()


@pytest.fixture(scope="session")
def install_harness() -> Callable[[str], None]:
    """Install a harness's pinned CLI into the project cache before a node needs it."""

    def install(name: str) -> None:
        from polar.harness import install as install_package

        harness = load_harness(name, {})
        if harness.package is not None:
            install_package(harness.package, HARNESS_CACHE)

    return install
