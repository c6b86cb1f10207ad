"""The ``local`` runtime's own behaviour: the bubblewrap sandbox's lifecycle, binds, links
and pid 1, its start-up errors, and what ``sandbox: false`` refuses."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from polar.runtime import (
    RuntimeFailure,
    RuntimeNotStarted,
    RuntimeSpec,
    RuntimeStartError,
    UnsupportedSpec,
    create_runtime,
)

from support import procs
from support.hostnet import HostGateway
from support.paths import REPO
from support.runtimes import ISOLATED_KINDS, Runtimes, SpecMaker, spec_maker

pytestmark = pytest.mark.anyio

SRC = REPO / "src"

needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap is not installed (scripts/setup --sandbox)"
)


@pytest.fixture(params=ISOLATED_KINDS)
def make_spec(request: pytest.FixtureRequest) -> SpecMaker:
    return spec_maker(request.param, request)


def sandbox_processes(session_dir: Path) -> list[int]:
    """The host pids of the bubblewrap process of the sandbox of ``session_dir``."""
    return procs.with_argument(str(session_dir))


def state_dir_of(pid: int) -> Path:
    """The state directory bubblewrap binds at /run/polar (read from its command line)."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return Path(argv[argv.index("/run/polar") - 1])


async def test_binds_are_writable_directories_put_can_fill(
    runtimes: Runtimes, make_spec: SpecMaker, tmp_path: Path
) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("def test(): pass\n")
    runtime = await runtimes.start(make_spec(binds=("/tests", "/logs/verifier")))

    await runtime.put(tmp_path / "tests", "/tests")
    result = await runtime.exec(["sh", "-c", "cat /tests/test_x.py; echo 1 > /logs/verifier/r"])

    assert result.stdout == "def test(): pass\n"
    backing = runtime.session_dir / "binds"
    assert (backing / "tests" / "test_x.py").is_file()
    assert (backing / "logs" / "verifier" / "r").read_text() == "1\n"


async def test_get_copies_a_planted_link_as_a_link_never_its_host_target(
    runtimes: Runtimes, make_spec: SpecMaker, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("the host's secret\n")
    runtime = await runtimes.start(make_spec())
    await runtime.exec(["sh", "-c", f"mkdir out && ln -s {secret} out/leak && ln -s {secret} leak"])

    await runtime.get(f"{runtime.workdir}/out", tmp_path / "out")
    await runtime.get(f"{runtime.workdir}/leak", tmp_path / "leak")

    for copied in (tmp_path / "out" / "leak", tmp_path / "leak"):
        assert copied.is_symlink() and copied.readlink() == secret


async def test_a_command_cannot_kill_the_sandboxs_init(
    runtimes: Runtimes, make_spec: SpecMaker
) -> None:
    runtime = await runtimes.start(make_spec())

    signals = "KILL TERM INT HUP QUIT USR1 USR2 ALRM PIPE CHLD STOP CONT"
    await runtime.exec(["sh", "-c", f"for s in {signals}; do kill -$s 1; done"])
    after = await runtime.exec(["echo", "still here"])

    assert after.stdout == "still here\n"


@needs_bwrap
async def test_stop_leaves_no_sandbox_process_and_no_state(runtimes: Runtimes) -> None:
    runtime = await runtimes.start(RuntimeSpec())
    bwrap = sandbox_processes(runtime.session_dir)
    assert len(bwrap) == 1
    state = state_dir_of(bwrap[0])
    assert (state / "inside.py").is_file()
    started = asyncio.Event()
    sleeper = asyncio.ensure_future(
        runtime.exec(["sh", "-c", "echo up; exec sleep 300"], on_output=lambda *_: started.set())
    )
    await started.wait()

    await runtime.stop()
    await runtime.stop()

    assert (await sleeper).cancelled
    assert not procs.alive(bwrap[0])
    assert sandbox_processes(runtime.session_dir) == []
    assert not state.exists()
    assert (runtime.session_dir / "workspace").is_dir()  # the session's files stay


@needs_bwrap
async def test_a_sandbox_killed_from_outside_fails_its_commands_cleanly(
    runtimes: Runtimes,
) -> None:
    runtime = await runtimes.start(RuntimeSpec())
    started = asyncio.Event()
    running = asyncio.ensure_future(
        runtime.exec(["sh", "-c", "echo up; exec sleep 300"], on_output=lambda *_: started.set())
    )
    await started.wait()

    for pid in sandbox_processes(runtime.session_dir):
        os.kill(pid, signal.SIGKILL)
    result = await running

    assert result.exit_code != 0 and not result.ok
    with pytest.raises(RuntimeFailure):
        await runtime.exec(["true"])


ORPHANED = """
import asyncio, json, sys
from pathlib import Path
from polar.runtime import RuntimeSpec, create_runtime

async def main():
    spec = RuntimeSpec.model_validate_json(sys.argv[1])
    runtime = create_runtime(spec, Path(sys.argv[2]))
    await runtime.start()
    await runtime.exec(
        ["sh", "-c", "sleep 300 & setsid sleep 300 & echo started; wait"],
        env=json.loads(sys.argv[3]),
        on_output=lambda stream, line: print(line, end="", flush=True),
    )

asyncio.run(main())
"""
"""A Polar process that starts a runtime and a long command, to be killed mid-way."""


@pytest.mark.parametrize("sandbox", [False, True], ids=["plain", "sandbox"])
async def test_when_polar_dies_its_commands_and_sandbox_die_too(
    sandbox: bool, tmp_path: Path
) -> None:
    if sandbox and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (scripts/setup --sandbox)")
    spec = RuntimeSpec(sandbox=sandbox, network="none" if sandbox else "host")
    mark = procs.new_mark()
    session = tmp_path / "s"
    polar = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        ORPHANED,
        spec.model_dump_json(),
        str(session),
        json.dumps({**mark, "PATH": "/usr/bin:/bin"}),
        stdout=asyncio.subprocess.PIPE,
        # its state directory, which it dies too early to remove, stays in the test's
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert polar.stdout is not None
    assert await polar.stdout.readline() == b"started\n"
    assert len(procs.marked(mark)) >= 3

    polar.kill()
    await polar.wait()

    # the kernel's parent-death signal and the supervisors' end-of-file on stdin
    # arrive asynchronously: wait for them (bounded), then look
    for _ in range(200):
        if not procs.marked(mark) and not procs.with_argument(str(session)):
            break
        await asyncio.sleep(0.05)
    assert procs.marked(mark) == []
    assert procs.with_argument(str(session)) == []


UNPRIVILEGED = """
import asyncio, json, sys
from pathlib import Path
from polar.runtime import GatewayAddress, RuntimeSpec, create_runtime

async def main():
    session, port = Path(sys.argv[1]), int(sys.argv[2])
    runtime = create_runtime(RuntimeSpec(), session, GatewayAddress("127.0.0.1", port))
    await runtime.start()
    fetch = "import sys, urllib.request as u; print(u.urlopen(sys.argv[1]).read().decode())"
    results = [
        await runtime.exec(["sh", "-c", "id -u; echo written > file; cat file"]),
        await runtime.exec(["python3", "-c", fetch, f"{runtime.gateway_url}/v1/models"]),
        await runtime.exec(["sh", "-c", "sleep 300 & setsid sleep 300 & wait"], timeout_s=1),
    ]
    await runtime.stop()
    print(json.dumps([[r.exit_code, r.stdout, r.timed_out] for r in results]))

asyncio.run(main())
"""
"""Starts a gateway_only sandbox as whoever runs it and reports what its commands did."""


@pytest.fixture
def as_nobody() -> Iterator[tuple[list[str], dict[str, str], Path]]:
    """(command prefix, environment, a directory everyone may write) to run Polar as
    ``nobody``: the system's python3 with this virtualenv's packages (``nobody`` cannot
    enter root's home, where this interpreter lives)."""
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (scripts/setup --sandbox)")
    if os.geteuid() != 0:
        pytest.skip("not root: every sandbox test here already runs unprivileged")
    python = "/usr/bin/python3"
    if shutil.which("setpriv") is None or not os.path.exists(python):
        pytest.skip("needs setpriv and /usr/bin/python3 to run Polar as another user")
    version = [python, "-c", "import sys; print(sys.version_info[:2])"]
    if subprocess.run(version, capture_output=True, text=True).stdout.strip() != str(
        sys.version_info[:2]
    ):
        pytest.skip("/usr/bin/python3 is not this Python's version (the packages are compiled)")
    site = sysconfig.get_paths()["purelib"]
    shared = Path(tempfile.mkdtemp(prefix="polar-test-nobody-"))
    shared.chmod(0o777)
    prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python]
    yield prefix, {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{SRC}:{site}"}, shared
    shutil.rmtree(shared)


async def test_an_unprivileged_user_gets_the_same_sandbox_in_a_user_namespace(
    as_nobody: tuple[list[str], dict[str, str], Path],
) -> None:
    """Run as root (as here), the other tests never take bubblewrap's unprivileged
    path (``--unshare-user``); this runs Polar itself as ``nobody``."""
    prefix, env, shared = as_nobody
    with HostGateway() as gateway:
        polar = await asyncio.create_subprocess_exec(
            *prefix, "-c", UNPRIVILEGED, str(shared / "session"), str(gateway.port),
            env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await polar.communicate()

    assert polar.returncode == 0, err.decode()
    identity, fetched, overrun = json.loads(out)
    assert identity == [0, "65534\nwritten\n", False]
    assert json.loads(fetched[1])["hello"] == "from the host"
    assert overrun[2] is True


async def test_exec_before_start_or_after_stop_is_refused(tmp_path: Path) -> None:
    runtime = create_runtime(RuntimeSpec(sandbox=False, network="host"), tmp_path / "s")

    with pytest.raises(RuntimeNotStarted):
        await runtime.exec(["true"])
    await runtime.start()
    await runtime.stop()
    with pytest.raises(RuntimeNotStarted):
        await runtime.put(tmp_path, "/x")


async def test_a_missing_bwrap_or_python_fails_start_with_the_reason(tmp_path: Path) -> None:
    no_bwrap = create_runtime(RuntimeSpec(options={"bwrap": "/no/bwrap"}), tmp_path / "a")
    no_python = create_runtime(RuntimeSpec(options={"python": "/no/python3"}), tmp_path / "b")

    with pytest.raises(RuntimeStartError, match="bubblewrap"):
        await no_bwrap.start()
    if shutil.which("bwrap") is not None:
        with pytest.raises(RuntimeStartError, match="/no/python3"):
            await no_python.start()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"network": "gateway_only"}, "cannot restrict the network"),
        ({"network": "none"}, "cannot restrict the network"),
        ({"network": "host", "binds": ("/tests",)}, "cannot bind"),
        ({"network": "host", "memory_mb": 100}, "cannot enforce limits"),
        ({"network": "host", "options": {"image": "x"}}, "unknown options"),
    ],
)
def test_plain_processes_refuse_what_they_cannot_isolate(
    fields: dict[str, Any], message: str, tmp_path: Path
) -> None:
    with pytest.raises(UnsupportedSpec, match=message):
        create_runtime(RuntimeSpec(sandbox=False, **fields), tmp_path)


@pytest.mark.parametrize("path", ["tests", "/", "/a/../b", "/usr/x", "/run/polar", "/proc"])
def test_bind_paths_must_be_absolute_and_leave_the_system_alone(path: str, tmp_path: Path) -> None:
    with pytest.raises(UnsupportedSpec):
        create_runtime(RuntimeSpec(binds=(path,)), tmp_path)
