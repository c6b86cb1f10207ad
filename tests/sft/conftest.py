"""Fixtures for the SFT tests: the tiny random Qwen3 model (real tokenizer)."""

from __future__ import annotations

from pathlib import Path

import pytest

from polar.tinymodel.build import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny-qwen3")
