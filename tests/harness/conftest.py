"""Fixtures for harness tests: the project's harness cache, installed on demand."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from polar.harness import DEFAULT_CACHE_DIR, Harness, RunSpec, install

from support import agents_model as agents_model_build

CACHE_DIR = Path(__file__).resolve().parents[2] / DEFAULT_CACHE_DIR
"""The project's harness cache (what ``polar harness install`` fills by default)."""


@pytest.fixture(scope="session")
def harness_cache() -> Path:
    return CACHE_DIR


@pytest.fixture(scope="session")
def installed() -> Callable[[Harness], Path]:
    """Install a harness's pinned CLI into the project cache (once per session); its path.

    The first install downloads from npm/PyPI (a minute or two); later sessions
    find it in ``.cache/harness`` and take milliseconds.
    """
    done: dict[str, Path] = {}

    def get(harness: Harness) -> Path:
        assert harness.package is not None
        if harness.name not in done:
            done[harness.name] = install(harness.package, CACHE_DIR)
        return done[harness.name]

    return get


@pytest.fixture
def make_spec(tmp_path: Path) -> Callable[..., RunSpec]:
    """A RunSpec with a fresh HOME and workdir under the test's tmp_path."""

    def make(**fields: Any) -> RunSpec:
        workdir = tmp_path / "work"
        workdir.mkdir(exist_ok=True)
        values: dict[str, Any] = {
            "gateway_url": "http://127.0.0.1:8000",
            "api_key": "sk-polar-test-key-9f2c",
            "model": "policy",
            "instruction": "Write polar into proof.txt",
            "workdir": workdir,
            "home": tmp_path / "home",
            "timeout_s": 120.0,
            "path": os.environ.get("PATH", ""),
            **fields,
        }
        return RunSpec(**values)

    return make


@pytest.fixture(scope="session")
def agents_model() -> Path:
    """What ``polar model init`` + ``polar model warm-up`` build, in the project's
    cache (kept between runs: minutes the first time, a marker check after).

    The tiny model taught, on each pinned CLI's own prompts recorded in a
    rehearsal, the tool call that CLI accepts (:mod:`polar.tinymodel.rehearsal`).
    Built in the background while the rest of the suite runs
    (:mod:`support.agents_model`); the tests using it run last."""
    return agents_model_build.wait()
