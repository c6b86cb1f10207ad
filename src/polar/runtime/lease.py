"""Leases: which live process owns a name or a directory on this machine.

A node names what it creates on the host after its id (cgroups, state
directories, container labels: :func:`~polar.runtime.layout.owner_prefix`)
and keeps its sessions' directories and their loop-mounted images under its
``sessions_dir``. When it starts it removes what a killed instance left
(:mod:`polar.runtime.reap`). That is right only if no live process owns them:
two nodes started with one id, or sharing a sessions directory, would remove
each other's live sandboxes. So a process takes a lease on each name or
directory before it reaps or creates anything under it, and holds it while it
lives.

A lease is an exclusive ``flock`` on a file in the machine's lease directory
(``/run/polar-leases``, or ``<tmp>/polar-leases-<uid>`` where ``/run`` cannot
be written), named by a digest of what it is for. The descriptor stays open
for the life of the lease; the kernel releases the lock when the process exits,
``kill -9`` included, and no lock survives a reboot. A lease let go of removes
its file first; one whose holder was killed stays, unlocked, for the next. So the lock itself is the
liveness check of the owner: no pid that could have been reused, no clock. The
file says who holds it (pid, when the process started, the boot id) for the
one-line error a second claimant gets (:class:`LeaseHeld`). Within one
process, a second lease on the same key conflicts too (``flock`` locks belong
to an open file description, not to a process).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
import time
from pathlib import Path

import orjson

from polar.runtime.errors import RuntimeFailure

RUN_DIR = Path("/run/polar-leases")


class LeaseHeld(RuntimeFailure):
    """Another live process holds the lease (the message names it, one line)."""


def lease_dir() -> Path:
    """The machine's lease directory (created on first use)."""
    with contextlib.suppress(OSError):
        RUN_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        if os.access(RUN_DIR, os.W_OK):
            return RUN_DIR
    fallback = Path(tempfile.gettempdir()) / f"polar-leases-{os.getuid()}"
    fallback.mkdir(mode=0o700, exist_ok=True)
    return fallback


class Lease:
    """One held lease; :meth:`release` (or the process's end) lets it go."""

    def __init__(self, path: Path, fd: int, what: str) -> None:
        self.path = path
        self.what = what
        self._fd: int | None = fd

    @classmethod
    def take(cls, what: str, holder: str, *, directory: Path | None = None) -> Lease:
        """The lease on ``what`` (``node id node-1``, ``sessions_dir /srv/s``), held
        for ``holder`` (said to whoever asks next); raises :class:`LeaseHeld`
        when a live process holds it."""
        directory = directory or lease_dir()
        path = directory / f"{hashlib.sha256(what.encode()).hexdigest()[:24]}.lock"
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                # Its last holder may have removed the file between our open and our
                # lock: then the lock is on a file nobody else will open. Again.
                current = _inode(path)
            except BlockingIOError:
                owner = _describe(fd)
                os.close(fd)
                raise LeaseHeld(
                    f"{what} is held by a live process on this machine: {owner}"
                ) from None
            except BaseException:
                os.close(fd)
                raise
            if current == os.fstat(fd).st_ino:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, orjson.dumps(_holder(what, holder)), 0)
        return cls(path, fd, what)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Remove the file (still locked, so no one holds it meanwhile) and let go.
        A holder killed first leaves the file, unlocked: the next one takes it."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()
            os.close(self._fd)  # closing the descriptor releases the lock
            self._fd = None


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def _holder(what: str, holder: str) -> dict[str, object]:
    return {
        "what": what,
        "holder": holder,
        "pid": os.getpid(),
        "started": _process_start(os.getpid()),
        "boot_id": _boot_id(),
        "taken_at": time.time(),
    }


def _describe(fd: int) -> str:
    """Who the lease file says holds it."""
    try:
        data = orjson.loads(os.pread(fd, 1 << 16, 0))
        holder, pid = str(data["holder"]), int(data["pid"])
    except (OSError, ValueError, KeyError, TypeError, orjson.JSONDecodeError):
        return "a process that has not said who it is"
    return f"{holder} (pid {pid})"


def _process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
