"""``polar serve --backend ray`` on a multi-node Ray cluster the test starts on this machine.

``ray.cluster_utils.Cluster`` starts a head and a worker raylet, each its own set of
processes with its own resources (1 ``sandbox`` each), so the two gateway-node actors land
one per Ray node. ``polar serve`` runs as a real subprocess that joins that cluster; the
engine is the scripted engine in this process; agents run in bubblewrap sandboxes. Killing
the worker raylet mid-run kills its node actor and the sessions in it: they must end ERROR
naming the dead node, and the group must still complete through resampling on the other."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from ray.cluster_utils import Cluster

from polar.proxy.engines.vllm_process import free_port
from polar.rollout.client import RolloutClient, RolloutError
from polar.rollout.protocol import HarnessSpec, SessionStatus, TaskStatus, TaskSubmission
from polar.runtime.reap import reap
from polar.testing.scripted import ScriptedEngine, script_from_dict

from support.agents import agent_task, shell_harness
from support.rollout import CONTROL_TOKEN, HARNESS_CACHE
from support.waiting import wait_until

HELLO = {"turns": [{"text": "hello"}], "cycle": True}


@pytest.fixture
def cluster() -> Iterator[tuple[Cluster, Any]]:
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "resources": {"sandbox": 1}, "include_dashboard": False},
    )
    worker = cluster.add_node(num_cpus=2, resources={"sandbox": 1})
    cluster.wait_for_nodes()
    try:
        yield cluster, worker
    finally:
        cluster.shutdown()


def test_nodes_spread_over_ray_and_a_killed_node_is_resampled_elsewhere(
    cluster: tuple[Cluster, Any], tokenizer: Any, tmp_path: Path
) -> None:
    ray_cluster, worker = cluster
    port = free_port()
    engine = ScriptedEngine(script_from_dict({"sessions": [HELLO] * 8}), tokenizer).start()
    config = {
        "backend": "ray",
        "ray": {"address": ray_cluster.address, "nodes": 2, "num_cpus": 0, "ping_interval_s": 0.5},
        "server": {"port": port, "db": str(tmp_path / "rollout.db"), "node_timeout_s": 60},
        "node": {
            "node_id": "raynode",
            "control_token": CONTROL_TOKEN,
            "sessions_dir": str(tmp_path / "sessions"),
            "files_dir": str(tmp_path / "files"),
            "harness_cache": str(HARNESS_CACHE),
            "heartbeat_interval_s": 0.5,
            "capacity": {"run": 2, "ahead": 0},
            "limits": {"workspace_mb": None},
            "gateway": {
                "capture": "token_in_token_out",
                "admin_token": CONTROL_TOKEN,
                "engine": {"kind": "vllm", "base_url": engine.url, "model": "scripted"},
                "store": {"path": str(tmp_path / "records.db")},
            },
        },
    }
    (tmp_path / "serve.yaml").write_text(yaml.safe_dump(config))
    log = (tmp_path / "serve.log").open("w")
    serve = subprocess.Popen(
        [sys.executable, "-m", "polar", "serve", "-c", str(tmp_path / "serve.yaml")],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        with RolloutClient(url, token=CONTROL_TOKEN) as client:

            def two_nodes() -> bool:
                assert serve.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
                try:
                    return len(client.nodes()) == 2
                except RolloutError:
                    return False

            wait_until(two_nodes, timeout_s=240, what="two node actors registered")
            submission = TaskSubmission(
                task=agent_task(tmp_path),
                harness=HarnessSpec(**shell_harness("slow", "8")),
                num_samples=4,
                max_resamples=4,
            )
            task_id = client.submit(submission).task_id

            def running_on(view: Any) -> set[str]:
                return {
                    s.node_id
                    for s in view.sessions
                    if s.node_id and s.status is SessionStatus.RUNNING
                }

            wait_until(
                lambda: len(running_on(client.task(task_id))) == 2,
                timeout_s=180,
                what="sessions running on both nodes",
            )
            before = time.monotonic()
            ray_cluster.remove_node(worker)  # the worker raylet and its node actor die
            result = client.wait(task_id, timeout_s=300)
            died_after_s = time.monotonic() - before
    finally:
        serve.terminate()
        serve.wait(timeout=60)
        log.close()
        engine.stop()
        for index in range(2):
            asyncio.run(reap(f"raynode-{index}", sessions_dir=tmp_path / "sessions"))

    assert result.status is TaskStatus.COMPLETED, result
    errors = [r for r in result.results if r.status is SessionStatus.ERROR]
    completed = [r for r in result.results if r.status is SessionStatus.COMPLETED]
    assert len(completed) == 4, [(r.status, r.error) for r in result.results]
    assert [r.reward for r in completed] == [1.0] * 4
    assert errors, "the killed node's sessions end ERROR"
    (dead,) = {r.node_id for r in errors}
    assert {r.node_id for r in completed} - {dead}, "the group finished on the other node"
    for r in errors:
        assert r.error is not None
        assert r.error.startswith(f"node {dead} died: Ray reports its actor died"), r.error
    assert len(result.replaced) == len(errors)
    print(f"killed node's sessions ended and the group completed {died_after_s:.1f} s after")
