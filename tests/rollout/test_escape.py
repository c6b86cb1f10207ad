"""The escape suite: an agent in its sandbox, on a node with the default
security settings (its API on a port of its own, the control token, the
default policy), tries to reach the control plane, the host, other sessions
and the hidden tests, and to exhaust its limits. Every attempt must fail, each
session must end with the right status, and the node must keep serving.

Everything is real: the rollout server, the node (gateway and API on their
two ports), the local bubblewrap sandbox with its cgroup, size-limited
``/tmp`` and loop-mounted session directory. The agent is a program run by
the ``shell`` harness (``support.escape``). The node's limits are set small
(the defaults are the same mechanism at larger sizes) so that hitting them
takes a moment.

The suite runs twice: on the local bubblewrap backend, and with the node's
runtime set to the ``docker`` backend driving podman (the test image of
``support.images``, built by ``scripts/setup --sandbox``; skipped, saying why,
where podman or the image is missing). Every attempt applies to podman and
every limit is enforced there with the same session errors (pids through
``--pids-limit``, memory through ``--memory``, a sized tmpfs ``/tmp``, the
same loop-mounted session directory). One outcome differs by nature: a
container has its own root filesystem, so ``/etc/shadow`` (and
``/proc/1/root/etc/shadow``) read the *image's* file; the test checks that
it is not the host's (different SHA-256). ``share_python`` does not apply to
a container (it runs the image's Python), so the package is mounted
explicitly in both cases.

The repository's ``src`` is mounted into every sandbox (as ``share_python``
mounts ``sys.prefix``, and with it ``site-packages/polar``): the package, and
the task's hidden tests, must still be out of sight. A node run from a real
wheel install is ``tests/rollout/test_escape_wheel.py``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import polar
from polar.rollout.client import RolloutClient
from polar.rollout.protocol import (
    HarnessSpec,
    SessionStatus,
    TaskResult,
    TaskStatus,
    TaskSubmission,
)
from polar.runtime.base import RuntimeSpec
from polar.tasks.model import Task

from support import images
from support.escape import escape_harness, escape_task
from support.hostnet import Listener, host_ip
from support.rollout import CONTROL_TOKEN, RolloutStack

LIMITS = {"pids": 64, "memory_mb": 256, "tmp_mb": 16, "workspace_mb": 32, "cpu_time_s": 600}
PACKAGE = Path(polar.__file__).resolve().parent


def submit(client: RolloutClient, task: Task, harness: dict[str, Any]) -> str:
    return client.submit(TaskSubmission(task=task, harness=HarnessSpec(**harness))).task_id


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def finished(
    stack: RolloutStack, client: RolloutClient, task_id: str, timeout_s: float
) -> TaskResult:
    """The task's result; on a timeout, the failure says where its sessions were."""
    try:
        return client.wait(task_id, timeout_s=timeout_s)
    except TimeoutError:
        sessions = {s.id: s.status.value for s in stack.service.node.sessions.values()}
        raise AssertionError(f"{client.task(task_id)}; node sessions: {sessions}") from None


@pytest.fixture
def planted(tmp_path: Path) -> Iterator[dict[str, Path]]:
    """Secrets on the host outside every session: in the home, beside the sessions,
    and a task's hidden tests in a directory every sandbox mounts."""
    home = Path.home() / f".polar-escape-{uuid.uuid4().hex}"
    home.write_text("the host's secret\n")
    mounted = tmp_path / "mounted"
    hidden = mounted / "hidden_tests"
    hidden.mkdir(parents=True)
    (hidden / "test_secret.py").write_text("def test_secret(): pass\n")
    (mounted / "visible.txt").write_text("a file of the mount\n")
    yield {"home": home, "hidden": hidden, "mounted": mounted}
    home.unlink()


def node_runtime(backend: str) -> dict[str, Any]:
    """The node's runtime section for ``backend`` (skips where this host cannot run it)."""
    if backend == "sandbox":
        if shutil.which("bwrap") is None:
            pytest.skip("bubblewrap is not installed (scripts/setup --sandbox)")
        return {}
    client = images.find_client()
    if client is None or Path(client).name != "podman":
        pytest.skip("podman does not answer here (scripts/setup --sandbox)")
    try:
        image = images.ensure_image(client)
    except images.ImageUnavailable as exc:
        pytest.skip(f"the podman test image cannot be built here: {exc}")
    options = {"binary": client}
    if shutil.which("runc"):
        options["runtime"] = "runc"  # podman's crun refuses hybrid cgroup hierarchies
    return {"backend": "docker", "image": image, "options": options}


def sha256_of(path: str) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return "unreadable"


@pytest.mark.parametrize("backend", ["sandbox", "podman"])
def test_an_agent_cannot_escape_its_sandbox(
    make_rollout: Callable[..., RolloutStack],
    tmp_path: Path,
    planted: dict[str, Path],
    backend: str,
) -> None:
    src = PACKAGE.parent
    runtime = node_runtime(backend)
    stack = make_rollout(
        {"turns": [{"text": "no"}]},
        node={
            "keep_sessions": "always",
            "limits": LIMITS,
            "runtime": {
                **runtime,
                "mounts": [{"path": str(src)}, {"path": str(planted["mounted"])}],
            },
        },
    )
    sessions = stack.root / "sessions"
    stray = Path.cwd() / "oom"  # where podman's conmon used to note a memory-limit kill
    stray_before = stray.exists()
    address = host_ip()
    with (
        stack.client() as client,
        Listener("127.0.0.1") as loopback,
        Listener(address or "127.0.0.1") as external,
    ):
        victim_id = submit(
            client,
            escape_task(tmp_path, "victim"),
            {"name": "shell", "options": {"command": "sleep 120"}},
        )
        victim = sessions / f"{victim_id}-s0" / "workspace"
        wait_until(lambda: (victim / "mine.txt").exists(), 120, "the victim session")
        gateway_url = f"http://127.0.0.1:{stack.service.address[0].port}"
        targets = {
            "token": CONTROL_TOKEN,
            "node": stack.node_thread.control_url,
            "server": stack.url,
            "gateway": gateway_url,
            "listener": loopback.port,
            "host_ip": address,
            "listener_external": external.port,
            "reads": {
                "another session's file": str(victim / "mine.txt"),
                "the sessions directory's other entries": str(victim.parent),
                "the host's home secret": str(planted["home"]),
                "/etc/shadow": "/etc/shadow",
                "the task's hidden tests (in a mount)": str(planted["hidden"] / "test_secret.py"),
                "the task's hidden tests directory": str(planted["hidden"]),
                "built-in hidden tests (package in a mount)": str(
                    PACKAGE / "tasks" / "builtin" / "fix-median" / "hidden_tests"
                ),
                "built-in solution patch": str(
                    PACKAGE / "tasks" / "builtin" / "fix-median" / "solution.patch"
                ),
                "the node's record store": str(stack.root / "records.db"),
                "the server's database": str(stack.root / "rollout.db"),
            },
            "writes": {
                "another session's workspace": str(victim / "escaped"),
                "/etc": "/etc/escaped",
                "/usr": "/usr/escaped",
                "/": "/escaped",
                "the state directory": "/run/polar/escaped",
                "a mount": str(planted["mounted"] / "escaped"),
                "the package": str(PACKAGE / "escaped"),
            },
        }
        probe_id = submit(
            client,
            escape_task(tmp_path, "probe", hidden_tests=planted["hidden"]),
            escape_harness("probe", targets),
        )
        probe = finished(stack, client, probe_id, 180)
        client.cancel(victim_id)

        limit_ids = {
            mode: submit(client, escape_task(tmp_path, mode), escape_harness(mode))
            for mode in ("pids", "memory", "tmp", "disk")
        }
        marker = tmp_path / "ran-on-the-host"
        loose = escape_task(tmp_path, "loose").model_copy(
            update={"runtime": RuntimeSpec(sandbox=False, network="host")}
        )
        loose_id = submit(
            client, loose, {"name": "shell", "options": {"command": f"touch {marker}"}}
        )
        limited = {
            mode: finished(stack, client, task_id, 180) for mode, task_id in limit_ids.items()
        }
        refused = finished(stack, client, loose_id, 60)

        still_id = submit(
            client,
            escape_task(tmp_path, "after"),
            {"name": "shell", "options": {"command": "true"}},
        )
        after = finished(stack, client, still_id, 120)
        nodes = client.nodes()
        accepted = (loopback.accepted, external.accepted)

    session = probe.results[0]
    assert session.status is SessionStatus.COMPLETED, session
    report = json.loads(session.agent["stdout_tail"].strip().splitlines()[-1])
    print(json.dumps(report, indent=1))
    assert report.pop("relay model call, own key") == "ok 200", report
    worked = {name: outcome for name, outcome in report.items() if outcome.startswith("ok")}
    if backend == "podman":
        # The container's own root: /etc/shadow (and PID 1's view of it) is the
        # image's file, readable by the container's root, never the host's.
        host = sha256_of("/etc/shadow")
        for name in ("read /etc/shadow", "read /proc/1/root (the sandbox's init)"):
            outcome = worked.pop(name)
            assert outcome.startswith("ok read") and host not in outcome, (name, outcome)
    assert worked == {}, worked
    assert accepted == (0, 0)
    for name, path in targets["writes"].items():
        assert not Path(path).exists(), name
    assert not (victim / "escaped").exists()

    expected = {
        "pids": "process limit",
        "memory": "memory limit",
        "tmp": "filled its /tmp",
        "disk": "filled its session directory",
    }
    for mode, result in limited.items():
        (one,) = result.results
        assert one.status is SessionStatus.ERROR, (mode, one)
        assert one.error is not None and expected[mode] in one.error, (mode, one.error)

    (loose_session,) = refused.results
    assert loose_session.status is SessionStatus.ERROR
    assert loose_session.error is not None and "sandbox: false" in loose_session.error
    assert not marker.exists()

    assert stray.exists() == stray_before, "a runtime left a file in the node's directory"
    assert after.status is TaskStatus.COMPLETED and after.results[0].reward == 1.0
    assert [n["node_id"] for n in nodes] == [stack.node_config.node_id]
