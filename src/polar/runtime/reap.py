"""Removing what a killed owner's runtimes left on the host.

A node that is SIGKILLed cannot stop its runtimes. Local sandboxes die with
it (bubblewrap's ``--die-with-parent``), but their cgroups and state
directories stay, containers keep running, and size-limited session
directories stay mounted. Everything a runtime creates carries its owner
(``RuntimeSpec.owner``: a label on containers, a name prefix on cgroups and
state directories, :func:`~polar.runtime.layout.owner_prefix`), so the owner,
started again, calls :func:`reap` before it creates anything and removes
exactly what it left: other owners' runtimes are never touched.

What is named after an owner is a leftover only if no live process is that
owner: :func:`reap` is called while holding the owner's lease (and the
sessions directory's, :mod:`polar.runtime.lease`), which proves it. A second
process started with a live owner's name gets no lease and reaps nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

from polar.runtime import cgroups, disk, statedir
from polar.runtime.containers import run_cli
from polar.runtime.docker import CLIENTS, OWNER_LABEL


@dataclass(frozen=True, slots=True)
class Reaped:
    containers: int = 0
    cgroups: int = 0
    state_dirs: int = 0
    disks: int = 0

    @property
    def total(self) -> int:
        return self.containers + self.cgroups + self.state_dirs + self.disks


async def reap(
    owner: str, *, cgroup_root: Path | None = None, sessions_dir: Path | None = None
) -> Reaped:
    """Remove ``owner``'s leftover containers, cgroups, state directories and
    session-directory mounts (those under ``sessions_dir``)."""
    containers = await _containers(owner)
    groups = await asyncio.to_thread(_cgroups, owner, cgroup_root)
    states = statedir.leftovers(owner)
    for path in states:
        await asyncio.to_thread(shutil.rmtree, path, True)
    disks = 0
    if sessions_dir is not None:
        for path in disk.leftovers(sessions_dir):
            if path.suffix == ".img":
                path.unlink(missing_ok=True)
            else:
                await disk.unmount(path)
            disks += 1
    return Reaped(containers, groups, len(states), disks)


async def _containers(owner: str) -> int:
    removed: set[str] = set()
    for client in filter(None, map(shutil.which, CLIENTS)):
        listed = await run_cli(
            [client, "ps", "-a", "-q", "--filter", f"label={OWNER_LABEL}={owner}"], 60
        )
        # ``docker`` may be podman under another name: count each container once.
        ids = (
            [i for i in listed.stdout.split() if i not in removed] if listed.returncode == 0 else []
        )
        if ids:
            await run_cli([client, "rm", "-f", *ids], 120)
            removed.update(ids)
    return len(removed)


def _cgroups(owner: str, root: Path | None) -> int:
    found = cgroups.leftovers(root, owner)
    for directory in found:
        with contextlib.suppress(OSError, ValueError):
            for pid in (directory / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(pid), signal.SIGKILL)
    cgroups.Cgroup(tuple(found)).remove(wait_s=5.0)
    return len(found)
