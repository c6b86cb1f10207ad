"""Two gateway nodes on one machine, the second started while the first has a
live session.

A node's start-up clean-up used to remove everything named after its id and
everything in its sessions directory: a second node started with the first's
id removed the first's live sandboxes (their cgroups, killing what ran in
them, and their state directories), and those sessions failed. Now a node
holds leases on its id and directories (``polar.runtime.lease``) and reaps
only under them: a second node with a live node's id, or one of its
directories, refuses to start with one line and touches nothing; a node of
its own starts beside it. Everything is real: the rollout server, the nodes,
bubblewrap sandboxes with cgroups and loop-mounted session directories, the
``polar node`` CLI; the model is the scripted engine, the agent a stand-in
(``support.agents``, mode ``gated``: one call, a wait for the test's
go-ahead, another call).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from polar.rollout.config import NodeConfig
from polar.rollout.deploy import NodeThread, node_service
from polar.rollout.protocol import HarnessSpec, SessionStatus, TaskSubmission

from support.agents import agent_task, shell_harness
from support.rollout import RolloutStack
from support.waiting import wait_until


def _other_node(stack: RolloutStack, root: Path, **changes: Any) -> NodeConfig:
    """A node of the same server with its own directories and ports, then ``changes``."""
    root.mkdir(parents=True, exist_ok=True)
    config = stack.node_config.model_copy(
        update={
            "sessions_dir": root / "sessions",
            "files_dir": root / "files",
            "control_port": 0,
            "gateway": stack.node_config.gateway.model_copy(
                update={
                    "port": 0,
                    "store": stack.node_config.gateway.store.model_copy(
                        update={"path": root / "records.db"}
                    ),
                }
            ),
        }
    )
    return config.model_copy(update=changes)


def _polar_node(config: NodeConfig, path: Path) -> tuple[int | None, str]:
    """``polar node`` with ``config``: its exit status and what it wrote on stderr,
    or ``None`` if it was still running after two minutes (it started: stopped)."""
    path.write_text(yaml.safe_dump(config.model_dump(mode="json", exclude_unset=True)))
    process = subprocess.Popen(
        [sys.executable, "-m", "polar", "node", "--config", str(path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _, err = process.communicate(timeout=120)
        return process.returncode, err
    except subprocess.TimeoutExpired:
        process.terminate()
        _, err = process.communicate(timeout=60)
        return None, err


def test_a_second_node_never_touches_a_live_nodes_session(
    make_rollout: Any, tmp_path: Path
) -> None:
    stack: RolloutStack = make_rollout(
        {"sessions": [{"turns": [{"text": "one"}, {"text": "two"}]}]}
    )
    first = stack.node_config
    with stack.client() as client:
        task_id = client.submit(
            TaskSubmission(task=agent_task(tmp_path), harness=HarnessSpec(**shell_harness("gated")))
        ).task_id
        workspace = first.sessions_dir / f"{task_id}-s0" / "workspace"
        wait_until(lambda: (workspace / "started").exists(), 120, "the first session's agent")

        # The first node's id, its own directories: refused, in one line.
        same_id = _polar_node(_other_node(stack, tmp_path / "same-id"), tmp_path / "same.yaml")
        # Another id, the first node's sessions directory: refused too.
        shared = _other_node(stack, tmp_path / "shared", node_id=f"{first.node_id}-b")
        shared_dir = _polar_node(
            shared.model_copy(update={"sessions_dir": first.sessions_dir}), tmp_path / "b.yaml"
        )
        # A node of its own starts beside it, while the first session is live.
        beside = NodeThread(
            node_service(_other_node(stack, tmp_path / "beside", node_id=f"{first.node_id}-c"))
        ).start()
        try:
            (workspace / "go").write_text("1")
            result = client.wait(task_id, timeout_s=180)
        finally:
            beside.stop()

    (session,) = result.results
    assert session.status is SessionStatus.COMPLETED, session.error
    assert session.reward == 1.0
    assert (workspace / "done").exists()
    status, err = same_id
    assert status == 2, err
    (line,) = err.strip().splitlines()
    assert f"node id {first.node_id} is held by a live process" in line, line
    status, err = shared_dir
    assert status == 2, err
    (line,) = err.strip().splitlines()
    assert f"sessions_dir {first.sessions_dir.resolve()} is held" in line, line


def test_a_node_whose_leases_are_free_starts_and_reaps_what_a_dead_one_left(
    make_rollout: Any, tmp_path: Path
) -> None:
    """The leases die with their holder: the node stopped, the same id starts again."""
    stack: RolloutStack = make_rollout({"sessions": [{"turns": [{"text": "unused"}]}]})
    stack.stop_node()
    stale = stack.node_config.sessions_dir / "left-by-a-killed-node"
    stale.mkdir(parents=True)
    stack.start_node()
    assert not stale.exists()
