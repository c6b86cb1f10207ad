"""Files in and out of a runtime, for evaluators.

Evaluator files (the agent's patch, test reports) go to
``<session_dir>/eval/`` of the runtime that uses them: the session directory is
visible inside every runtime at the same path. Copies go through
:meth:`Runtime.get` / :meth:`Runtime.put`, so they work on every backend.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from polar.runtime.base import ExecResult, Runtime

EVAL_DIR = "eval"
LOG_TAIL = 4000
"""Characters of output kept in logs and messages."""
PROBE_TIMEOUT_S = 30.0


def eval_path(runtime: Runtime, name: str) -> str:
    return str(runtime.session_dir / EVAL_DIR / name)


def tail(text: str, limit: int = LOG_TAIL) -> str:
    return text[-limit:]


def output(result: ExecResult) -> str:
    return result.stdout + result.stderr


async def read_file(runtime: Runtime, path: str) -> bytes | None:
    """A file's bytes from inside ``runtime``; None when there is no such file."""
    probe = await runtime.exec(["test", "-f", path], timeout_s=PROBE_TIMEOUT_S)
    if probe.exit_code != 0:
        return None
    with tempfile.TemporaryDirectory(prefix="polar-eval-") as tmp:
        target = Path(tmp) / "file"
        await runtime.get(path, target)
        return await asyncio.to_thread(target.read_bytes)


async def write_file(runtime: Runtime, path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` inside ``runtime`` (parents created)."""
    with tempfile.TemporaryDirectory(prefix="polar-eval-") as tmp:
        source = Path(tmp) / "file"
        await asyncio.to_thread(source.write_bytes, data)
        await runtime.put(source, path)
