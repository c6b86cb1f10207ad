"""Agent CLIs ("harnesses") as Polar runs them: installed from pinned packages
into a project cache, configured inside an isolated HOME to reach only the
gateway with a session key, and run headless.

Presets (:mod:`polar.harness.presets`): ``codex``, ``claude_code``,
``qwen_code``, ``pi``, ``opencode``, ``mini_swe_agent``, ``gemini_cli``,
``shell``, and ``minicoder`` (Polar's own write-check-revise loop for small
models that do not call tools, :mod:`polar.harness.agents.minicoder`); any
other harness is a ``package.module:factory`` returning a :class:`Harness`.
"""

from polar.harness.base import DEFAULT_PATH, Harness, Invocation, RunSpec, base_env
from polar.harness.errors import (
    HarnessError,
    InstallError,
    InvalidHarnessOptions,
    InvalidRunSpec,
    UnknownHarness,
)
from polar.harness.install import (
    DEFAULT_CACHE_DIR,
    Toolchain,
    executable_path,
    install,
    installed_version,
    is_installed,
)
from polar.harness.package import NpmPackage, Package, PythonPackage
from polar.harness.process import ProcessResult, Stream, run_process
from polar.harness.registry import INSTALLABLE, PRESETS, check_harness, load_harness
from polar.harness.runner import HarnessRun, prepare, run_harness

__all__ = [
    "DEFAULT_CACHE_DIR",
    "DEFAULT_PATH",
    "INSTALLABLE",
    "PRESETS",
    "Harness",
    "HarnessError",
    "HarnessRun",
    "InstallError",
    "InvalidHarnessOptions",
    "InvalidRunSpec",
    "Invocation",
    "NpmPackage",
    "Package",
    "ProcessResult",
    "PythonPackage",
    "RunSpec",
    "Stream",
    "Toolchain",
    "UnknownHarness",
    "base_env",
    "check_harness",
    "executable_path",
    "install",
    "installed_version",
    "is_installed",
    "load_harness",
    "prepare",
    "run_harness",
    "run_process",
]
