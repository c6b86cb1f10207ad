"""The ``apptainer`` runtime's command lines.

Apptainer cannot run here: it is not packaged for Debian 12 and cannot be
installed from the registries these machines reach. So these tests check only
the command lines the backend builds (and that its absence is reported at
start), not their effect; its exec, copy, relay and kill paths are the ones
``test_contract.py`` and ``test_isolation.py`` run for real with the docker
backend (:mod:`polar.runtime.containers` is shared).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from polar.runtime import GatewayAddress, Mount, RuntimeSpec, RuntimeStartError, create_runtime
from polar.runtime.apptainer import ApptainerRuntime
from polar.runtime.statedir import StateDir

pytestmark = pytest.mark.anyio


def runtime_for(tmp_path: Path, **fields: object) -> ApptainerRuntime:
    spec = RuntimeSpec(backend="apptainer", image="/images/task.sif", **fields)  # type: ignore[arg-type]
    runtime = create_runtime(spec, tmp_path / "s", GatewayAddress("127.0.0.1", 8000))
    assert isinstance(runtime, ApptainerRuntime)
    return runtime


def test_the_instance_is_contained_bound_and_limited(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    runtime = runtime_for(
        tmp_path,
        cpus=2,
        memory_mb=512,
        pids=100,
        mounts=[Mount(path=tools), Mount(path=tmp_path / "cache", read_only=False)],
        binds=("/tests",),
    )
    state = StateDir(tmp_path / "state", tmp_path / "s" / ".polar-rw")

    argv = runtime.start_argv(state)

    session = str((tmp_path / "s").resolve())
    assert argv == [
        "apptainer", "instance", "start", "--containall", "--writable-tmpfs",
        "--net", "--network", "none",
        "--cpus", "2", "--memory", "512M", "--pids-limit", "100",
        "--bind", f"{session}:{session}:rw",
        "--bind", f"{tools}:{tools}:ro",
        "--bind", f"{tmp_path / 'cache'}:{tmp_path / 'cache'}:rw",
        "--bind", f"{session}/binds/tests:/tests:rw",
        "--bind", f"{state.path}:/run/polar:ro",
        "--bind", f"{state.rw}:/run/polar/rw:rw",
        "/images/task.sif", runtime.name,
    ]  # fmt: skip


def test_host_network_and_an_overlay_change_the_instance(tmp_path: Path) -> None:
    runtime = runtime_for(
        tmp_path, network="host", options={"overlay": "/o.img", "binary": "singularity"}
    )

    argv = runtime.start_argv(StateDir(tmp_path / "state", tmp_path / "s" / ".polar-rw"))

    assert argv[:6] == ["singularity", "instance", "start", "--containall", "--overlay", "/o.img"]
    assert "--net" not in argv and "--writable-tmpfs" not in argv


def test_the_init_and_every_command_run_in_the_instance_with_a_clean_environment(
    tmp_path: Path,
) -> None:
    runtime = runtime_for(tmp_path, network="gateway_only")
    instance = f"instance://{runtime.name}"

    assert runtime.exec_argv(interactive=True) == [
        "apptainer", "exec", "--cleanenv", "--pwd", "/", instance,
    ]  # fmt: skip
    assert runtime.init_exec_argv() == [
        "apptainer", "exec", "--cleanenv", "--pwd", "/", instance,
        "python3", "-I", "-S", "/run/polar/inside.py", "init",
        "--ready", "/run/polar/rw/ready.json", "--forward", "/run/polar/gateway.sock",
    ]  # fmt: skip


async def test_start_without_apptainer_says_so(tmp_path: Path) -> None:
    runtime = runtime_for(tmp_path, options={"binary": "/no/apptainer"})

    with pytest.raises(RuntimeStartError, match="/no/apptainer is not installed"):
        await runtime.start()
    await runtime.stop()
