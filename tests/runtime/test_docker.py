"""The ``docker`` runtime against a real engine: podman (or docker) running the image
:mod:`support.images` builds, through the same command-line client a node uses.

The behaviours every backend shares (exec, timeouts, copies, network
isolation, the gateway relay) are in ``test_contract.py`` and
``test_isolation.py``, which run this backend too; here is what is the
container's own: a session's whole flow, its limits, its removal, its errors.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from polar.runtime import GatewayAddress, RuntimeSpec, RuntimeStartError, create_runtime
from polar.runtime.docker import DockerRuntime
from polar.runtime.statedir import StateDir

from support import procs
from support.hostnet import PROBE, HostGateway, Listener
from support.runtimes import Runtimes, SpecMaker, spec_maker

pytestmark = pytest.mark.anyio


@pytest.fixture
def make_spec(request: pytest.FixtureRequest) -> SpecMaker:
    return spec_maker("docker", request)


@pytest.fixture
def gateway() -> Iterator[HostGateway]:
    with HostGateway() as server:
        yield server


async def inspect(client: str, name: str, *format: str) -> tuple[int, str]:
    """``<client> container inspect [--format F] NAME``: exit status and output."""
    process = await asyncio.create_subprocess_exec(
        client,
        "container",
        "inspect",
        *format,
        name,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    out, _ = await process.communicate()
    return process.returncode or 0, out.decode()


async def container_exists(client: str, name: str) -> bool:
    return (await inspect(client, name))[0] == 0


async def test_a_session_runs_start_to_stop_in_one_container(
    runtimes: Runtimes, make_spec: SpecMaker, gateway: HostGateway, tmp_path: Path
) -> None:
    """start, put the task's files, run the agent's commands (one reaching the gateway,
    one that overruns its timeout), get the result, stop: the container is gone."""
    repo = tmp_path / "task-repo"
    repo.mkdir()
    (repo / "solve.py").write_text(
        "import json, os, sys, urllib.request\n"
        "answer = urllib.request.urlopen(os.environ['GATEWAY'] + '/v1/models').read()\n"
        "open('answer.json', 'wb').write(answer)\n"
        "print('solved with', json.loads(answer)['hello'])\n"
    )
    with Listener("127.0.0.1") as elsewhere:
        runtime = await runtimes.start(
            make_spec(network="gateway_only", env={"TASK": "demo"}),
            GatewayAddress("127.0.0.1", gateway.port),
        )
        assert isinstance(runtime, DockerRuntime)
        client = runtime.spec.options["binary"]
        assert await container_exists(client, runtime.name)

        await runtime.put(repo, runtime.workdir)
        solved = await runtime.exec(
            ["python3", "solve.py"], env={"GATEWAY": str(runtime.gateway_url)}
        )
        probe = await runtime.exec(["python3", "-c", PROBE, elsewhere.target])
        reached = elsewhere.accepted
        mark = procs.new_mark()
        overrun = await runtime.exec(
            ["sh", "-c", "sleep 300 & setsid sleep 300 & echo started; wait"],
            env=mark,
            timeout_s=4,
        )
        survivors = procs.marked(mark)
        await runtime.get(f"{runtime.workdir}/answer.json", tmp_path / "answer.json")
        await runtime.stop()

    assert solved.stdout == "solved with from the host\n"
    assert gateway.requests == [("GET", "/v1/models")]
    assert "failed" in probe.stdout and reached == 0
    assert overrun.timed_out and overrun.stdout == "started\n" and survivors == []
    assert json.loads((tmp_path / "answer.json").read_text())["hello"] == "from the host"
    assert (runtime.session_dir / "workspace" / "answer.json").is_file()  # identity path
    assert not await container_exists(client, runtime.name)


async def test_limits_reach_the_container(runtimes: Runtimes, make_spec: SpecMaker) -> None:
    runtime = await runtimes.start(make_spec(cpus=0.5, memory_mb=100, pids=32))
    assert isinstance(runtime, DockerRuntime)
    client = runtime.spec.options["binary"]
    forker = (
        "import os, time\nn = 0\ntry:\n    while n < 100:\n"
        "        if os.fork() == 0:\n            time.sleep(60)\n            os._exit(0)\n"
        "        n += 1\nexcept OSError:\n    pass\nprint(n)"
    )

    fields = "{{.HostConfig.NanoCpus}} {{.HostConfig.Memory}} {{.HostConfig.PidsLimit}}"
    _, inspected = await inspect(client, runtime.name, "--format", fields)
    forked = await runtime.exec(["python3", "-c", forker])
    allocated = await runtime.exec(["python3", "-c", "b = b'x' * (300 * 2**20)\nprint('fits')"])

    assert inspected.split() == ["500000000", str(100 * 2**20), "32"]
    assert int(forked.stdout) < 32
    # The kernel kills the allocation (137) unless the limit watch, which kills what
    # runs at the first limit hit (here the refused forks), gets to it first.
    assert "fits" not in allocated.stdout
    assert allocated.exit_code == 128 + 9 or allocated.cancelled, allocated
    hit = runtime.limit_hit
    assert hit is not None and hit.kind.value == "pids", hit


async def test_an_image_without_the_helpers_python_fails_start_and_leaves_nothing(
    make_spec: SpecMaker, tmp_path: Path
) -> None:
    spec = make_spec(options={"python": "/no/python3"})
    runtime = create_runtime(spec, tmp_path / "s")
    assert isinstance(runtime, DockerRuntime)

    with pytest.raises(RuntimeStartError, match="/no/python3"):
        await runtime.start()

    assert not await container_exists(spec.options["binary"], runtime.name)
    await runtime.stop()


async def test_a_missing_client_fails_start_with_the_reason(tmp_path: Path) -> None:
    spec = RuntimeSpec(backend="docker", image="any", options={"binary": "/no/podman"})
    runtime = create_runtime(spec, tmp_path / "s")

    with pytest.raises(RuntimeStartError, match="/no/podman is not installed"):
        await runtime.start()
    await runtime.stop()


def test_the_create_command_line_maps_the_spec(tmp_path: Path) -> None:
    """Pure: the ``create`` arguments for a spec with every setting (no engine needed)."""
    tools = tmp_path / "tools"
    spec = RuntimeSpec(
        backend="docker",
        image="example/image:1",
        network="gateway_only",
        cpus=1.5,
        memory_mb=2048,
        pids=256,
        mounts=[{"path": tools}],
        binds=("/tests",),
        options={"runtime": "runc", "ulimits": "nofile=4096:4096"},
    )
    runtime = DockerRuntime(spec, tmp_path / "s", GatewayAddress("127.0.0.1", 8000))
    state = StateDir(tmp_path / "state", tmp_path / "s" / ".polar-rw")

    argv = runtime.create_argv("podman", state)

    session = str((tmp_path / "s").resolve())
    expected_pairs = [
        ("--runtime", "runc"),
        ("--network", "none"),
        ("--cpus", "1.5"),
        ("--memory", "2048m"),
        ("--memory-swap", "2048m"),
        ("--pids-limit", "256"),
        ("--ulimit", "nofile=4096:4096"),
        ("-v", f"{session}:{session}:rw"),
        ("-v", f"{tools}:{tools}:ro"),
        ("-v", f"{session}/binds/tests:/tests:rw"),
        ("-v", f"{state.path}:/run/polar:ro"),
        ("--entrypoint", "python3"),
    ]
    pairs = list(itertools.pairwise(argv))
    assert [pair for pair in expected_pairs if pair not in pairs] == []
    assert argv[:2] == ["podman", "create"]
    image_at = argv.index("example/image:1")
    assert argv[image_at + 1 :] == [
        "-I", "-S", "/run/polar/inside.py", "init",
        "--ready", "/run/polar/rw/ready.json", "--forward", "/run/polar/gateway.sock",
    ]  # fmt: skip


async def test_stop_after_the_container_vanished_does_not_raise(
    runtimes: Runtimes, make_spec: SpecMaker
) -> None:
    runtime = await runtimes.start(make_spec())
    assert isinstance(runtime, DockerRuntime)
    client = runtime.spec.options["binary"]
    for command in ("kill", "rm"):
        removed = await asyncio.create_subprocess_exec(
            client, command, runtime.name, stdout=asyncio.subprocess.DEVNULL
        )
        await removed.wait()

    orphaned = await runtime.exec(["true"])
    await runtime.stop()
    await runtime.stop()

    assert not orphaned.ok
    assert not await container_exists(client, runtime.name)
