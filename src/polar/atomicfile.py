"""Writing a file or a directory so that a reader sees the old content or the
new, never half of it.

:func:`atomic_path` is for one file: a temporary name next to it, renamed onto
it (``os.replace``, atomic on POSIX). :func:`atomic_directory` is for a
directory (a model, a checkpoint, a policy version): a sibling directory
filled, then renamed into place. A directory cannot be renamed onto a
non-empty one, so an older one is first moved aside and removed after: the
path is at every moment the old directory or the new one, or (between the two
renames) absent, never a mixture.

A failed write leaves nothing behind. A writer killed outright leaves its
temporary: a file's carries the process id (two writers of one file may
overlap); a directory's has a fixed name (``.NAME.tmp``, and ``.NAME.old``
for the one moved aside), so the next write of that directory removes what a
killed one left. Two writers of one directory at once are not supported.
"""

from __future__ import annotations

import contextlib
import os
import shutil
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


@contextlib.contextmanager
def atomic_directory(path: Path) -> Iterator[Path]:
    """An empty directory next to ``path`` (``.NAME.tmp``, parents created) to fill:
    put in place of ``path`` when the block ends (an older ``path`` replaced),
    removed when it raises (a failed write leaves ``path`` as it was)."""
    temporary = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(temporary, ignore_errors=True)  # what a killed writer left
    temporary.mkdir(parents=True)
    try:
        yield temporary
        _put_in_place(temporary, path)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise


def _put_in_place(temporary: Path, path: Path) -> None:
    old = path.with_name(f".{path.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        path.rename(old)
    temporary.rename(path)
    shutil.rmtree(old, ignore_errors=True)
