"""The session directory's layout and the spec's binds, shared by every backend."""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Sequence
from pathlib import Path

from polar.runtime.errors import UnsupportedSpec

SESSION_SUBDIRS = ("workspace", "home", "logs")
RESERVED = ("/run/polar", "/proc", "/dev", "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib64")
"""Inside paths a bind may not cover (the runtime's own and the system's)."""


def bind_backings(session_dir: Path, binds: Sequence[str]) -> tuple[tuple[Path, str], ...]:
    """(host backing directory, inside path) of each bind: ``/tests`` is backed by
    ``<session_dir>/binds/tests``."""
    pairs = []
    for path in binds:
        if not path.startswith("/") or posixpath.normpath(path) != path or path == "/":
            raise UnsupportedSpec(f"bind paths must be absolute and normalized, got {path!r}")
        if any(path == r or path.startswith(f"{r}/") for r in RESERVED):
            raise UnsupportedSpec(f"bind path {path} would cover a system or runtime directory")
        pairs.append((session_dir / "binds" / path.lstrip("/"), path))
    return tuple(pairs)


def prepare(session_dir: Path, backings: Sequence[tuple[Path, str]]) -> None:
    """Create the session directory's standard subdirectories and the binds' backings."""
    for name in SESSION_SUBDIRS:
        (session_dir / name).mkdir(parents=True, exist_ok=True)
    for backing, _ in backings:
        backing.mkdir(parents=True, exist_ok=True)


def owner_prefix(owner: str | None) -> str:
    """How the host-side things of ``owner``'s runtimes are named (state
    directories, cgroups): ``polar+<hash of owner>+`` (``+`` cannot occur in an
    owner, so one owner's prefix never matches another's), ``polar-`` without one."""
    if owner is None:
        return "polar-"
    return f"polar+{hashlib.sha256(owner.encode()).hexdigest()[:12]}+"
