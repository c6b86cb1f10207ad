"""Watching a sandbox's limits: which one it hit, so the session can end saying so.

The kernel enforces the limits (a cgroup's ``pids.max``, ``memory.max``, a
size-limited filesystem); what it does not do is tell anyone. A fork that
fails, a process the OOM killer took, a write that got ``ENOSPC`` look like
ordinary failures to whoever runs in the sandbox. :class:`LimitWatch` reads the
counters every :data:`POLL_S` while the sandbox lives and, at the first limit
hit, reports it (:class:`~polar.runtime.base.LimitHit`) and runs the runtime's
``on_hit`` (which kills every running command), once:

- **pids**: the cgroup refused a ``fork``/``clone`` (``pids.events`` ``max``);
- **memory**: the OOM killer killed a process of the cgroup (``oom_kill``);
- **cpu_time**: the cgroup's CPU usage passed ``cpu_time_s`` (the kernel has no
  such limit: this watch is what enforces it, within a poll);
- **tmp** / **disk**: the sandbox's ``/tmp`` or the session directory's
  filesystem is (nearly) full: less than :func:`margin` left, or no inode.

A counter that cannot be read (the host hides it) never counts as a hit.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from polar.runtime.base import LimitHit, LimitKind
from polar.runtime.cgroups import Cgroup, Limits
from polar.runtime.inside import process_children

POLL_S = 0.25
MIB = 2**20


@dataclass(frozen=True, slots=True)
class SizedPath:
    """A size-limited filesystem to watch: where the host sees it, and its limit."""

    kind: LimitKind
    path: Path
    size_mb: int
    label: str
    """What it is for people (``/tmp``, ``session directory``)."""


def margin(total_bytes: int) -> int:
    """Free space below which a filesystem counts as full: 4 MiB, or 5% of a small
    one. Not zero: ext4 refuses a write (``ENOSPC``) while it still reports free
    blocks it keeps for the metadata of delayed allocations (about 600 KiB left
    of a 32 MB filesystem filled in 1 MiB writes)."""
    return min(4 * MIB, total_bytes // 20)


def cgroup_hit(cgroup: Cgroup, limits: Limits) -> LimitHit | None:
    usage = cgroup.usage()
    if limits.pids is not None and usage.pids_refused:
        return LimitHit(
            LimitKind.PIDS,
            f"the sandbox hit its process limit ({limits.pids} processes and threads): "
            f"{usage.pids_refused} fork(s) refused",
        )
    if limits.memory_mb is not None and usage.oom_kills:
        return LimitHit(
            LimitKind.MEMORY,
            f"the sandbox hit its memory limit ({limits.memory_mb} MB): "
            f"{usage.oom_kills} process(es) killed",
        )
    spent = usage.cpu_s
    if limits.cpu_time_s is not None and spent is not None and spent >= limits.cpu_time_s:
        return LimitHit(
            LimitKind.CPU_TIME,
            f"the sandbox used up its CPU time ({limits.cpu_time_s:g} s; {spent:.1f} s used)",
        )
    return None


def path_hit(sized: SizedPath) -> LimitHit | None:
    try:
        stat = os.statvfs(sized.path)
    except OSError:
        return None
    total = stat.f_blocks * stat.f_frsize
    free = stat.f_bavail * stat.f_frsize
    if total and (free < margin(total) or (stat.f_files and stat.f_favail == 0)):
        return LimitHit(
            sized.kind, f"the sandbox filled its {sized.label} (limit {sized.size_mb} MB)"
        )
    return None


class LimitWatch:
    """Polls ``check`` until stopped; on the first hit, keeps it and awaits ``on_hit``."""

    def __init__(
        self,
        check: Callable[[], LimitHit | None],
        on_hit: Callable[[], Awaitable[None]],
        poll_s: float = POLL_S,
    ) -> None:
        self._check = check
        self._on_hit = on_hit
        self._poll_s = poll_s
        self.hit: LimitHit | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def poll(self) -> LimitHit | None:
        """Check now (the runtime does before reporting, so a late hit is not missed)."""
        if self.hit is None:
            self.hit = self._check()
        return self.hit

    async def _run(self) -> None:
        while self.hit is None:
            await asyncio.sleep(self._poll_s)
            if await asyncio.to_thread(self.poll) is not None:
                await self._on_hit()


def checks(
    cgroup: Cgroup | None, limits: Limits, paths: list[SizedPath]
) -> Callable[[], LimitHit | None]:
    """One check over a cgroup's counters and size-limited paths."""

    def check() -> LimitHit | None:
        if cgroup is not None and (hit := cgroup_hit(cgroup, limits)) is not None:
            return hit
        for sized in paths:
            if (hit := path_hit(sized)) is not None:
                return hit
        return None

    return check


def children(pid: int) -> list[int]:
    """Host pids whose parent is ``pid`` (found through /proc)."""
    return process_children().get(pid, [])


def session_disk(session_dir: Path) -> list[SizedPath]:
    """The session directory, when it is its own size-limited filesystem
    (:mod:`polar.runtime.disk`): a mount point, watched for being full."""
    if not os.path.ismount(session_dir):
        return []
    try:
        stat = os.statvfs(session_dir)
    except OSError:
        return []
    size_mb = stat.f_blocks * stat.f_frsize // MIB
    return [SizedPath(LimitKind.DISK, session_dir, size_mb, "session directory")]
