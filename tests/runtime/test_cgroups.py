"""CPU, memory and process limits of the local sandbox, enforced through a real cgroup.

These run wherever this process may create cgroups (root on a v1 hierarchy,
as on the project's machines, or a delegated v2 subtree); elsewhere the spec
is refused with UnsupportedSpec and they are skipped with that message. The
refusal itself is tested everywhere. The CPU quota is checked as written,
not by timing a busy loop.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from polar.runtime import RuntimeSpec, UnsupportedSpec, create_runtime

from support import procs
from support.runtimes import Runtimes

pytestmark = pytest.mark.anyio

CGROUPS = Path("/sys/fs/cgroup")
LIMITS = {"cpus": 0.5, "memory_mb": 100, "pids": 32}
PATH = {"PATH": "/usr/bin:/bin"}


@pytest.fixture
def limited(tmp_path: Path) -> RuntimeSpec:
    """A sandbox spec with every limit, skipped where this host cannot enforce them."""
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (scripts/setup --sandbox)")
    spec = RuntimeSpec(**LIMITS)
    try:
        create_runtime(spec, tmp_path / "probe")
    except UnsupportedSpec as exc:
        pytest.skip(f"this host cannot give a sandbox cgroup limits: {exc}")
    return spec


def cgroup_dirs(pid: int) -> dict[str, Path]:
    """Controller -> the host directory of ``pid``'s cgroup (v1 or unified)."""
    dirs = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for name in ("cpu", "memory", "pids"):
            if name in controllers.split(","):
                dirs[name] = CGROUPS / name / path.lstrip("/")
            elif controllers == "" and not (CGROUPS / "cpu").is_dir():
                dirs.setdefault(name, CGROUPS / path.lstrip("/"))
    return dirs


def read(directory: Path, *names: str) -> str:
    """The first of ``names`` that exists in ``directory`` (v1 and v2 spell them apart)."""
    for name in names:
        if (directory / name).exists():
            return (directory / name).read_text().strip()
    raise AssertionError(f"none of {names} in {directory}")


async def test_limits_are_written_to_a_cgroup_holding_every_process_of_the_sandbox(
    runtimes: Runtimes, limited: RuntimeSpec
) -> None:
    runtime = await runtimes.start(limited)
    (bwrap,) = procs.with_argument(str(runtime.session_dir))
    mark = procs.new_mark()
    started = asyncio.Event()
    command = asyncio.ensure_future(
        runtime.exec(
            ["sh", "-c", "echo started; exec sleep 300"],
            env={**mark, **PATH},
            on_output=lambda *_: started.set(),
        )
    )
    await started.wait()

    dirs = cgroup_dirs(bwrap)
    (sleeper,) = procs.marked(mark)

    assert cgroup_dirs(sleeper) == dirs
    assert read(dirs["cpu"], "cpu.cfs_quota_us", "cpu.max").split()[0] == "50000"
    assert read(dirs["memory"], "memory.limit_in_bytes", "memory.max") == str(100 * 2**20)
    assert read(dirs["pids"], "pids.max") == "32"
    if not (CGROUPS / "cgroup.controllers").exists():
        # v1: below this process's own cgroups, so the sandbox stays inside what limits Polar
        own = cgroup_dirs(os.getpid())
        assert {name: d.parent for name, d in dirs.items()} == {name: own[name] for name in dirs}
    await runtime.stop()
    assert (await command).cancelled
    assert [directory for directory in dirs.values() if directory.exists()] == []


async def test_a_command_over_the_memory_limit_is_killed(
    runtimes: Runtimes, limited: RuntimeSpec
) -> None:
    runtime = await runtimes.start(limited)

    result = await runtime.exec(
        ["python3", "-c", "data = b'x' * (300 * 2**20); print('allocated')"], env=PATH
    )

    assert "allocated" not in result.stdout
    # SIGKILL from the cgroup's OOM killer (137), unless the limit watch, which
    # kills what runs once it reads the OOM kill, reports first (cancelled).
    assert result.exit_code == 128 + 9 or result.cancelled, result
    hit = runtime.limit_hit
    assert hit is not None and hit.kind.value == "memory", hit


async def test_the_pids_limit_stops_forks(runtimes: Runtimes, limited: RuntimeSpec) -> None:
    runtime = await runtimes.start(limited)
    forker = """
import errno, os, time
children = 0
try:
    while children < 100:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        children += 1
    print(children, "no error")
except OSError as exc:
    print(children, errno.errorcode[exc.errno])
"""

    result = await runtime.exec(["python3", "-c", forker], env=PATH)

    children, error = result.stdout.split()
    assert error == "EAGAIN" and int(children) < LIMITS["pids"]


def test_a_cgroup_root_that_cannot_hold_limits_is_refused(tmp_path: Path) -> None:
    spec = RuntimeSpec(memory_mb=100, options={"cgroup_root": str(tmp_path)})

    with pytest.raises(UnsupportedSpec, match="cgroup"):
        create_runtime(spec, tmp_path / "s")


@pytest.mark.parametrize(
    ("fields", "program", "kind"),
    [
        ({"cpu_time_s": 1.0}, "while True: pass", "cpu_time"),
        (
            {"tmp_mb": 8},
            "import time\nf = open('/tmp/fill', 'wb')\n"
            "try:\n    [f.write(b'x' * 2**20) or f.flush() for _ in range(64)]\n"
            "except OSError:\n    time.sleep(60)",
            "tmp",
        ),
    ],
    ids=["cpu_time", "tmp"],
)
async def test_a_limit_hit_kills_what_runs_and_says_which(
    runtimes: Runtimes, tmp_path: Path, fields: dict[str, float], program: str, kind: str
) -> None:
    """CPU time has no kernel limit (the watch enforces it); a full ``/tmp`` is only an
    ``ENOSPC`` to the process. Either way the command is killed and the runtime says why."""
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (scripts/setup --sandbox)")
    spec = RuntimeSpec(**fields)
    try:
        create_runtime(spec, tmp_path / "probe")
    except UnsupportedSpec as exc:
        pytest.skip(f"this host cannot give a sandbox these limits: {exc}")
    runtime = await runtimes.start(spec)

    result = await runtime.exec(["python3", "-c", program], timeout_s=60)

    assert not result.timed_out and not result.ok
    hit = runtime.limit_hit
    assert hit is not None and hit.kind.value == kind, hit
