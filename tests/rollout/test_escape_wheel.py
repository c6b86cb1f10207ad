"""Hidden material in a real wheel install: a node run from a virtual
environment where Polar was installed from its wheel (not the editable
checkout), with ``share_python: true`` (the default, which mounts that
environment's ``sys.prefix`` into every sandbox, ``site-packages/polar``
included), must not let its sandboxed agent read the built-in tasks' hidden
tests and patches.

The wheel is built from this checkout (``pip wheel --no-deps
--no-build-isolation``: offline, a few seconds, once per test session) and
checked to carry the hidden tests and patches; it is installed with ``pip
install --no-deps --target`` into the ``site-packages`` of a throwaway
virtual environment whose ``.pth`` file points at the test environment's
packages for the dependencies (not at ``src``: ``import polar`` there is
the wheel's, which the fixture checks). The node is that environment's
``python -m polar node``, a real subprocess joining the test's real rollout
server; the agent is the escape program (``support.escape``) run by the
``shell`` harness in the local bubblewrap sandbox.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from polar.proxy.engines.vllm_process import free_port
from polar.rollout.protocol import HarnessSpec, SessionStatus, TaskSubmission

from support.escape import escape_harness, escape_task
from support.paths import REPO
from support.rollout import CONTROL_TOKEN, HARNESS_CACHE, RolloutStack

BUILTIN = Path("polar") / "tasks" / "builtin"
HIDDEN = ("fix-median/hidden_tests/tests/test_hidden_median.py", "fix-median/solution.patch")
LIMITS = {"pids": 256, "memory_mb": 1024, "tmp_mb": 64, "workspace_mb": 64}


def purelib(python: Path) -> Path:
    code = "import sysconfig; print(sysconfig.get_path('purelib'))"
    return Path(subprocess.check_output([str(python), "-c", code], text=True).strip())


@pytest.fixture(scope="session")
def wheel_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment with Polar installed from a freshly built wheel."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("the tests do not run in a virtual environment (scripts/setup makes .venv)")
    root = tmp_path_factory.mktemp("wheel")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    dist = root / "dist"
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(REPO)],
        check=True,
        timeout=300,
    )
    (wheel,) = dist.glob("polar-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in HIDDEN:
        assert (BUILTIN / name).as_posix() in names, name
    env = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    python = env / "bin" / "python"
    site = purelib(python)
    subprocess.run(
        [*pip, "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
        check=True,
        timeout=300,
    )
    (site / "test-dependencies.pth").write_text(f"{purelib(Path(sys.executable))}\n")
    where = subprocess.check_output([str(python), "-c", "import polar; print(polar.__file__)"])
    assert Path(where.decode().strip()).is_relative_to(site), where
    return env


@pytest.fixture
def wheel_node(
    wheel_env: Path, make_rollout: Callable[..., RolloutStack], tmp_path: Path
) -> Iterator[tuple[RolloutStack, Path]]:
    """The test's rollout server with its node replaced by ``python -m polar node``
    run from the wheel's environment (same node id, so it takes the node's place)."""
    stack = make_rollout({"turns": [{"text": "no"}]})
    stack.stop_node()
    control_port = free_port()
    config = {
        "node_id": stack.node_config.node_id,
        "server_url": stack.url,
        "control_token": CONTROL_TOKEN,
        "control_port": control_port,
        "heartbeat_interval_s": 0.5,
        "result_retry_s": 0.2,
        "sessions_dir": str(tmp_path / "wheel-sessions"),
        "harness_cache": str(HARNESS_CACHE),
        "keep_sessions": "always",
        "limits": LIMITS,
        "gateway": {
            "port": free_port(),
            "admin_token": CONTROL_TOKEN,
            "engine": {"kind": "vllm", "base_url": stack.engine.url, "model": "scripted"},
            "store": {"path": str(tmp_path / "wheel-records.db")},
        },
    }
    path = tmp_path / "wheel-node.yaml"
    path.write_text(yaml.safe_dump(config))
    log = (tmp_path / "wheel-node.log").open("w")
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    node = subprocess.Popen(
        [str(wheel_env / "bin" / "python"), "-m", "polar", "node", "-c", str(path)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=environment,
        cwd=tmp_path,
    )
    try:
        url = f"http://127.0.0.1:{control_port}"
        deadline = time.monotonic() + 60
        with stack.client() as client:
            while not any(n.get("url") == url for n in client.nodes()):
                assert node.poll() is None, (tmp_path / "wheel-node.log").read_text()
                assert time.monotonic() < deadline, (tmp_path / "wheel-node.log").read_text()
                time.sleep(0.2)
        yield stack, purelib(wheel_env / "bin" / "python")
    finally:
        node.terminate()
        node.wait(30)
        log.close()


def test_a_wheel_installs_hidden_material_is_out_of_the_sandbox(
    wheel_node: tuple[RolloutStack, Path], tmp_path: Path
) -> None:
    stack, site = wheel_node
    installed = site / BUILTIN
    reads: dict[str, str] = {name: str(installed / name) for name in HIDDEN}
    reads["the built-in tasks directory"] = str(installed)
    reads["the package's __init__.py"] = str(site / "polar" / "__init__.py")
    reads["a file beside the package (positive control)"] = str(site / "test-dependencies.pth")
    reads["the environment's pyvenv.cfg (positive control)"] = str(site.parents[2] / "pyvenv.cfg")
    for name in HIDDEN:
        assert (installed / name).is_file(), name
    harness: dict[str, Any] = escape_harness("read", reads)
    with stack.client() as client:
        task = escape_task(tmp_path, "wheel")
        task_id = client.submit(TaskSubmission(task=task, harness=HarnessSpec(**harness))).task_id
        result = client.wait(task_id, timeout_s=120)
    (session,) = result.results
    assert session.status is SessionStatus.COMPLETED, session
    report = json.loads(session.agent["stdout_tail"].strip().splitlines()[-1])
    print(json.dumps(report, indent=1))
    # share_python did mount the wheel's environment: its files are readable...
    for control in ("the environment's pyvenv.cfg", "a file beside the package"):
        assert report.pop(f"{control} (positive control)").startswith("ok read"), control
    # ...but the whole package directory is covered, hidden tests and patches with it.
    assert {name: outcome for name, outcome in report.items() if outcome.startswith("ok")} == {}
