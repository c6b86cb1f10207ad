"""What a SIGKILLed owner leaves on the host, and its successor reaping exactly that.

The leftovers are real: a podman container (created, not started) labelled with the owner, a
cgroup with a process in it, a state directory in the temporary directory, a
loop-mounted session directory with its image. A second owner's leftovers are
made the same way and must survive.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from polar.runtime import cgroups
from polar.runtime.disk import IMAGES_DIR, SizedDir, check
from polar.runtime.docker import OWNER_LABEL
from polar.runtime.errors import UnsupportedSpec
from polar.runtime.reap import reap
from polar.runtime.statedir import StateDir


def _container(client: str, image: str, owner: str) -> str:
    created = subprocess.run(
        [client, "create", "--network", "none", "--label", f"{OWNER_LABEL}={owner}",
         "--entrypoint", "sleep", image, "600"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return created.stdout.strip()


def _containers(client: str, owner: str) -> list[str]:
    listed = subprocess.run(
        [client, "ps", "-a", "-q", "--filter", f"label={OWNER_LABEL}={owner}"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return listed.stdout.split()


def test_a_restarted_owner_reaps_what_it_left_and_nothing_else(
    tmp_path: Path, container_image: tuple[str, str]
) -> None:
    try:
        check(16)
        cgroups.check(None, cgroups.Limits(pids=16))
    except UnsupportedSpec as exc:
        pytest.skip(f"this host cannot make the leftovers: {exc}")
    client, image = container_image
    sessions = tmp_path / "sessions"
    run = uuid.uuid4().hex[:8]
    mine, theirs = f"node-killed-{run}", f"node-other-{run}"
    for owner in (mine, theirs):
        (tmp_path / owner).mkdir()

    states = {owner: StateDir.create(tmp_path / owner, owner) for owner in (mine, theirs)}
    groups = {
        owner: cgroups.create(None, cgroups.Limits(pids=16), owner) for owner in (mine, theirs)
    }
    sleeper = subprocess.Popen(["sleep", "600"])
    for procs in groups[mine].procs_files:
        procs.write_text(str(sleeper.pid))
    disk = asyncio.run(SizedDir.create(sessions / "s-1", 16))
    containers = {owner: _container(client, image, owner) for owner in (mine, theirs)}
    try:
        reaped = asyncio.run(reap(mine, sessions_dir=sessions))

        assert (reaped.containers, reaped.cgroups, reaped.state_dirs) == (1, 1, 1)
        assert reaped.disks == 2  # the mount and its image
        assert _containers(client, mine) == []
        assert _containers(client, theirs) == [containers[theirs][:12]]
        assert not states[mine].path.exists()
        assert states[theirs].path.exists()
        assert not any(d.exists() for d in groups[mine].dirs)
        assert all(d.exists() for d in groups[theirs].dirs)
        assert sleeper.wait(timeout=30) == -9
        assert not os.path.ismount(disk.path)
        assert list((sessions / IMAGES_DIR).glob("*.img")) == []
    finally:
        sleeper.kill()
        sleeper.wait()
        subprocess.run([client, "rm", "-f", *containers.values()], capture_output=True)
        states[theirs].remove()
        groups[theirs].remove(wait_s=0)
        asyncio.run(disk.remove(keep=False))
