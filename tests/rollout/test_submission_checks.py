"""What the rollout server tells an operator at once: a harness that could not run
is refused at submission (422 naming the field, nothing stored), a task none of
whose sessions completed is ``failed``, not ``completed``, and a trainer learns
the nodes' gateways and their admin tokens from the server, under the control
token, instead of from a secret it cannot see."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar.rollout.protocol import HarnessSpec, SessionStatus, TaskStatus, TaskSubmission
from polar.tasks.model import EvaluatorSpec
from polar.train.weightsync import GatewayAdmin, WeightSyncError, rollout_gateways

from support.agents import agent_task, shell_harness
from support.rollout import CONTROL_TOKEN, RolloutStack

HELLO = {"turns": [{"text": "hello"}]}
AUTH = {"authorization": f"Bearer {CONTROL_TOKEN}"}


@pytest.mark.parametrize(
    ("harness", "message"),
    [
        (
            {"name": "nope"},
            "harness.name: unknown harness 'nope'; use one of ['claude_code', 'codex', "
            "'gemini_cli', 'mini_swe_agent', 'minicoder', 'opencode', 'pi', 'qwen_code', "
            "'shell'] or 'package.module:factory'",
        ),
        ({"name": "shell"}, "harness.options: shell: needs a command (option command=...)"),
        (
            {"name": "minicoder", "options": {"max_turns": "two"}},
            "harness.options: harness minicoder: max_turns: Input should be a valid integer, "
            "unable to parse string as an integer",
        ),
    ],
)
def test_a_harness_that_cannot_run_is_refused_at_submission(
    make_rollout: Callable[..., RolloutStack],
    tmp_path: Path,
    harness: dict[str, Any],
    message: str,
) -> None:
    stack = make_rollout({"sessions": [HELLO]})
    body = {"task": agent_task(tmp_path).model_dump(mode="json"), "harness": harness}

    with httpx.Client(base_url=stack.url, headers=AUTH, timeout=30) as http:
        reply = http.post("/tasks", json=body)
        assert reply.status_code == 422, reply.text
        assert reply.json()["error"]["message"] == message
        assert http.get("/tasks").json() == []


def test_a_plugin_harness_the_server_cannot_import_is_left_to_the_nodes(
    make_rollout: Callable[..., RolloutStack], tmp_path: Path
) -> None:
    """It may be installed only where harnesses run; the session reports it if not."""
    stack = make_rollout({"sessions": [HELLO]})
    submission = TaskSubmission(
        task=agent_task(tmp_path), harness=HarnessSpec(name="not_installed_here.agents:Agent")
    )
    with stack.client() as client:
        assert client.submit(submission).status is TaskStatus.RUNNING


def test_a_task_none_of_whose_sessions_completed_is_failed(
    make_rollout: Callable[..., RolloutStack], tmp_path: Path
) -> None:
    stack = make_rollout(
        {"sessions": [HELLO, HELLO]}, node={"policy": {"plugins": ["support.agents:crashing"]}}
    )
    task = agent_task(tmp_path, evaluator=EvaluatorSpec(kind="support.agents:crashing"))
    submission = TaskSubmission(
        task=task, harness=HarnessSpec(**shell_harness("ok")), num_samples=2
    )
    with stack.client() as client:
        task_id = client.submit(submission).task_id
        result = client.wait(task_id, timeout_s=120)
        view = client.task(task_id)

    assert [s.status for s in result.results] == [SessionStatus.ERROR, SessionStatus.ERROR]
    assert result.status is view.status is TaskStatus.FAILED


def test_the_server_tells_a_trainer_its_nodes_gateways_under_the_control_token(
    make_rollout: Callable[..., RolloutStack], tmp_path: Path
) -> None:
    stack = make_rollout({"sessions": [HELLO]})
    node = stack.node_config

    with httpx.Client(base_url=stack.url, timeout=30) as http:
        assert http.get("/gateways").status_code == 401
        listed = http.get("/gateways", headers=AUTH).json()
    assert listed == [
        {
            "node_id": node.node_id,
            "url": stack.node_thread.gateway_url,
            "admin_token": node.gateway.admin_token,
        }
    ]
    targets = rollout_gateways(stack.url, CONTROL_TOKEN, wait_s=0)
    assert [(t.url, t.admin_token) for t in targets] == [
        (stack.node_thread.gateway_url, node.gateway.admin_token)
    ]
    admin = GatewayAdmin(targets[0])  # what weight sync does first: the gateway answers
    try:
        assert admin.state().policy_version is not None
    finally:
        admin.close()
    with pytest.raises(WeightSyncError) as caught:
        rollout_gateways(stack.url, "wrong-token-0123456789", wait_s=0)
    assert str(caught.value) == (
        "weight_sync.gateways: none given, and the rollout server did not list its "
        "nodes' gateways: missing or wrong control token"
    )
    # The admin token is handed out, never written to the server's database.
    with contextlib.closing(sqlite3.connect(stack.server_config.db)) as db:
        stored = " ".join(row[0] for row in db.execute("SELECT registration FROM nodes"))
    assert node.node_id in stored
    assert node.gateway.admin_token not in stored
