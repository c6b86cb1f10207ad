"""Writing a file so that a reader sees the old content or the new, never half of it."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary name next to ``path`` to write to: renamed onto ``path`` when
    the block ends, removed when it raises (a failed write leaves nothing)."""
    temporary = path.parent / f".{path.name}.{os.getpid()}.tmp"
    try:
        yield temporary
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
