"""One headless harness run: install if needed, configure, run, collect the result."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from polar.harness.base import Harness, Invocation, RunSpec, base_env
from polar.harness.errors import InvalidRunSpec
from polar.harness.install import DEFAULT_CACHE_DIR, Toolchain, install
from polar.harness.process import OutputHandler, ProcessResult, run_process


@dataclass(frozen=True, slots=True)
class HarnessRun:
    """What a run did: the files it configured, the command, and how it ended."""

    harness: str
    config_files: tuple[Path, ...]
    invocation: Invocation
    result: ProcessResult


def prepare(
    harness: Harness,
    spec: RunSpec,
    *,
    cache_dir: Path = DEFAULT_CACHE_DIR,
    toolchain: Toolchain | None = None,
) -> tuple[tuple[Path, ...], Invocation]:
    """Install the harness if needed and write its configuration into ``spec.home``."""
    if not spec.workdir.is_dir():
        raise InvalidRunSpec(f"working directory {spec.workdir} does not exist")
    executable = install(harness.package, cache_dir, toolchain) if harness.package else None
    spec.home.mkdir(parents=True, exist_ok=True)
    files = harness.write_config(spec)
    return files, harness.invocation(spec, executable)


def run_harness(
    harness: Harness,
    spec: RunSpec,
    *,
    cache_dir: Path = DEFAULT_CACHE_DIR,
    toolchain: Toolchain | None = None,
    on_output: OutputHandler | None = None,
) -> HarnessRun:
    """Run ``spec.instruction`` through the harness as a local subprocess in ``spec.workdir``.

    The process sees only :func:`~polar.harness.base.base_env` plus the
    harness's own variables, with stdin closed; it is killed (with its process
    group) after ``spec.timeout_s``.
    """
    files, invocation = prepare(harness, spec, cache_dir=cache_dir, toolchain=toolchain)
    result = run_process(
        invocation.argv,
        cwd=spec.workdir,
        env={**base_env(spec), **invocation.env},
        timeout_s=spec.timeout_s,
        on_output=on_output,
    )
    return HarnessRun(
        harness=harness.name, config_files=files, invocation=invocation, result=result
    )
