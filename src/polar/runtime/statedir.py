"""A sandboxed runtime's private host directory, and file copies through it.

Every sandbox sees the state directory read-only at :data:`STATE_INSIDE`: the
helper program (:data:`SCRIPT_INSIDE`) and the gateway relay's socket
(:data:`SOCKET_INSIDE`). It lives in the system's temporary directory rather
than in the session directory, because a Unix socket path must stay under 108
bytes; its name carries the runtime's owner (:func:`~polar.runtime.layout.owner_prefix`) so that a
restarted owner finds what a killed one left. The one directory writable from
inside, :data:`RW_INSIDE` (the ready file of container inits and the staging
area of copies), is backed by ``<session_dir>/.polar-rw`` instead: whatever a
sandbox writes lands in its session directory, whose size may be limited
(:mod:`polar.runtime.disk`), never in the host's temporary directory.

Copies in and out of a sandbox never resolve a path of the sandbox on the host:
:func:`put` stages the source in ``rw/`` and lets ``inside.py copy`` place it,
:func:`get` lets ``inside.py copy`` stage it and copies the staged tree out
(links kept as links). A link a command planted in the workspace (say
``tests -> /root``) therefore leads somewhere inside the sandbox, never to the
host's files.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from polar.runtime import inside
from polar.runtime.base import ExecResult
from polar.runtime.errors import CopyError
from polar.runtime.layout import owner_prefix

STATE_INSIDE = "/run/polar"
SCRIPT_INSIDE = f"{STATE_INSIDE}/inside.py"
SOCKET_INSIDE = f"{STATE_INSIDE}/gateway.sock"
RW_INSIDE = f"{STATE_INSIDE}/rw"
READY_INSIDE = f"{RW_INSIDE}/ready.json"

Run = Callable[[Sequence[str]], Awaitable[ExecResult]]
"""Runs a command inside the sandbox (no timeout, no output handler)."""


RW_DIR = ".polar-rw"


class StateDir:
    def __init__(self, path: Path, rw: Path) -> None:
        self.path = path
        self.rw = rw

    @classmethod
    def create(cls, session_dir: Path, owner: str | None = None) -> StateDir:
        path = Path(tempfile.mkdtemp(prefix=owner_prefix(owner)))
        path.chmod(0o755)
        shutil.copyfile(inside.__file__, path / "inside.py")
        (path / "rw").mkdir()  # the mount point of the writable directory
        rw = session_dir / RW_DIR
        shutil.rmtree(rw, ignore_errors=True)
        rw.mkdir()
        return cls(path, rw)

    @property
    def socket(self) -> Path:
        return self.path / "gateway.sock"

    @property
    def ready(self) -> Path:
        return self.rw / "ready.json"

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        shutil.rmtree(self.rw, ignore_errors=True)


def leftovers(owner: str) -> list[Path]:
    """State directories a runtime of ``owner`` left in the temporary directory."""
    return [p for p in Path(tempfile.gettempdir()).glob(f"{owner_prefix(owner)}*") if p.is_dir()]


def copy_path(source: Path, target: Path) -> None:
    """Copy a file or a directory tree (symlinks kept as links); parents created."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir() and not source.is_symlink():
            shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
        else:
            shutil.copy2(source, target, follow_symlinks=False)
    except (OSError, shutil.Error) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise CopyError(f"cannot copy {source} to {target}: {reason}") from None


def _stage_in(source: Path, staged: Path) -> None:
    if not source.exists() and not source.is_symlink():
        raise CopyError(f"cannot copy {source}: no such file or directory")
    copy_path(source, staged)


def _copy_argv(python: str, source: str, target: str) -> list[str]:
    return [python, "-I", "-S", SCRIPT_INSIDE, "copy", source, target]


async def put(state: StateDir, run: Run, python: str, source: Path, target: str) -> None:
    """Copy the host's ``source`` to ``target`` as the sandbox sees it."""
    token = uuid.uuid4().hex
    try:
        await asyncio.to_thread(_stage_in, source, state.rw / token / "item")
        result = await run(_copy_argv(python, f"{RW_INSIDE}/{token}/item", target))
    finally:
        shutil.rmtree(state.rw / token, ignore_errors=True)
    if not result.ok:
        raise CopyError(result.stderr.strip() or f"cannot copy {source} to {target}")


async def get(state: StateDir, run: Run, python: str, source: str, target: Path) -> None:
    """Copy ``source`` as the sandbox sees it to the host's ``target``."""
    token = uuid.uuid4().hex
    try:
        result = await run(_copy_argv(python, source, f"{RW_INSIDE}/{token}/item"))
        if not result.ok:
            raise CopyError(result.stderr.strip() or f"cannot copy {source} to {target}")
        await asyncio.to_thread(copy_path, state.rw / token / "item", target)
    finally:
        shutil.rmtree(state.rw / token, ignore_errors=True)
