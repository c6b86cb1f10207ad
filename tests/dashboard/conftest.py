"""Fixtures of the dashboard tests: a record store of the recorded CLI sessions,
a dashboard over it, and one headless Chromium for all of them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.dashboard import Dashboard, fill_store, have_browser, recorded_sessions, start_browser


@pytest.fixture(scope="module")
def recorded_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real record store holding every recorded CLI session (``<cli>.<capture>``)."""
    path = tmp_path_factory.mktemp("records") / "records.db"
    fill_store(path, recorded_sessions())
    return path


@pytest.fixture(scope="module")
def dashboard(recorded_store: Path, tokenizer: Any) -> Iterator[Dashboard]:
    board = Dashboard(tokenizer, stores=(recorded_store,))
    yield board
    board.close()


@pytest.fixture(scope="session")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Headless Chromium. Without Debian's chromium and chromium-driver these tests
    skip, except in CI (``scripts/setup --browser`` installs them there), where
    that is a failure."""
    if not have_browser():
        if os.environ.get("CI"):
            pytest.fail("chromium and chromium-driver are missing (scripts/setup --browser)")
        pytest.skip("chromium and chromium-driver are not installed (scripts/setup --browser)")
    driver = start_browser(tmp_path_factory.mktemp("chromium-profile"))
    yield driver
    driver.quit()
