"""Fixtures for the trainer tests: the default tiny model and an embedded engine serving it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from polar.tinymodel.build import build_tiny_model

from support.training import EmbeddedEngine


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``polar model init``'s model: random Qwen3-architecture weights, the Qwen3 tokenizer."""
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-qwen3")


@pytest.fixture
def embedded_engine(tiny_model: Path) -> Iterator[EmbeddedEngine]:
    """A fresh embedded engine on the tiny model (tests push weights into it)."""
    engine = EmbeddedEngine(tiny_model)
    yield engine
    engine.close()
