"""Sessions that do not end well, through the real rollout server and node:
cancelled mid-run, hung past the timeout, a harness that fails before or after
the model answered, an engine that fails, an evaluator that crashes, a server
restarted mid-task; each with its failure reason (``polar.rollout.failure``).
The agent is a stand-in process tree (``support.agents``) run by the ``shell``
harness in a real bubblewrap sandbox; the model is the scripted engine."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from polar.rollout.client import RolloutClient
from polar.rollout.failure import FailureReason
from polar.rollout.protocol import (
    HarnessSpec,
    SessionStatus,
    TaskResult,
    TaskStatus,
    TaskSubmission,
)
from polar.tasks.model import EvaluatorSpec, Task

from support.agents import MARKERS, agent_task, host_processes, shell_harness
from support.rollout import RolloutStack

HELLO = {"turns": [{"text": "hello"}]}


def scripts(n: int) -> dict[str, Any]:
    return {"sessions": [HELLO] * n}


def submit(client: RolloutClient, task: Task, harness: dict[str, Any], **fields: Any) -> str:
    submission = TaskSubmission(task=task, harness=HarnessSpec(**harness), **fields)
    return client.submit(submission).task_id


def wait_until(predicate: Callable[[], bool], timeout_s: float = 60.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.1)


def workspace(stack: RolloutStack, session_id: str) -> Path:
    return stack.root / "sessions" / session_id / "workspace"


def started(stack: RolloutStack, session_id: str) -> bool:
    return (workspace(stack, session_id) / "started").exists()


def sandbox_processes(stack: RolloutStack, session_id: str) -> list[int]:
    return host_processes(str(stack.root / "sessions" / session_id))


def only(result: TaskResult) -> Any:
    assert len(result.results) == 1
    return result.results[0]


def test_cancel_mid_run_kills_the_process_tree_and_frees_the_runtime(
    make_rollout: Callable[..., RolloutStack], tmp_path: Path
) -> None:
    stack = make_rollout(scripts(1))
    with stack.client() as client:
        task_id = submit(client, agent_task(tmp_path), shell_harness("tree"))
        sid = f"{task_id}-s0"
        wait_until(lambda: started(stack, sid), what="the agent to start")
        wait_until(lambda: len(host_processes("sleep 730")) >= 2, what="its children")
        assert sandbox_processes(stack, sid), "the sandbox runs while the agent does"

        client.cancel(task_id)
        result = client.wait(task_id, timeout_s=60)

    assert result.status is TaskStatus.CANCELLED
    session = only(result)
    assert session.status is SessionStatus.CANCELLED
    assert session.failure is FailureReason.CANCELLED
    assert session.reward is None
    for marker in MARKERS:
        assert host_processes(marker) == [], f"{marker} survived the cancel"
    assert sandbox_processes(stack, sid) == [], "the sandbox was not freed"


def test_a_hung_harness_ends_timeout_with_its_partial_trajectory(
    make_rollout: Callable[..., RolloutStack], tmp_path: Path
) -> None:
    stack = make_rollout(scripts(1))
    with stack.client() as client:
        task_id = submit(client, agent_task(tmp_path), shell_harness("hang"), session_timeout_s=4.0)
        result = client.wait(task_id, timeout_s=120)

    session = only(result)
    assert session.status is SessionStatus.TIMEOUT
    assert session.failure is FailureReason.TIMEOUT, "the model answered before the hang"
    assert (session.error or "").startswith(
        "the session timeout fired: the harness ran past its 4 s budget (session_timeout_s)"
    )
    assert session.reward is None, "a timed-out session is not scored"
    assert session.records == 1
    assert len(session.samples) == 1, "the call made before the hang is kept"
    assert session.samples[0]["reward"] is None
    assert session.agent["timed_out"] is True
    assert host_processes("agent.py hang") == []
    assert result.usable == 0


def test_a_failing_harness_ends_error_with_its_output(
    make_rollout: Callable[..., RolloutStack], tmp_path: Path
) -> None:
    stack = make_rollout(scripts(1))
    with stack.client() as client:
        task_id = submit(client, agent_task(tmp_path), shell_harness("fail"))
        session = only(client.wait(task_id, timeout_s=60))

    assert session.status is SessionStatus.ERROR
    # What ended it first, then its last lines on both streams (not only the warning).
    error = session.error or ""
    assert error.startswith("the harness exited with code 3 after "), error
    # It never called the model: whatever made it exit, it was not the model's doing.
    assert session.failure is FailureReason.HARNESS
    assert error.endswith(
        " s (the model answered no call); last output: stderr: Warning: Input is not a "
        "terminal; stdout: starting | Error: the agent gave up"
    ), error


def test_a_harness_that_gives_up_after_the_model_answered_is_the_agents_failure(
    make_rollout: Callable[..., RolloutStack], tmp_path: Path
) -> None:
    """Its turn limit, say: an ERROR whose fault is the agent's, with the partial
    trajectory; max_resamples does not replace it (it is a result)."""
    stack = make_rollout(scripts(2))
    with stack.client() as client:
        task_id = submit(
            client, agent_task(tmp_path), shell_harness("give_up"), num_samples=2, max_resamples=2
        )
        result = client.wait(task_id, timeout_s=120)

    assert [r.sample_index for r in result.results] == [0, 1] and result.replaced == []
    for session in result.results:
        assert session.status is SessionStatus.ERROR
        assert session.failure is FailureReason.AGENT_EXIT
        assert "turn limit reached" in (session.error or "")
        assert session.records == 1 and len(session.samples) == 1


def test_an_engine_failure_is_the_infrastructures_and_is_resampled(
    make_rollout: Callable[..., RolloutStack], tmp_path: Path
) -> None:
    """The agent's second call fails at the engine (the script has one turn: the
    scripted engine answers 500), then the agent exits non-zero: ``engine``, not the
    agent's; the group is refilled by a session that gets a whole script."""
    stack = make_rollout(
        {"sessions": [HELLO, {"turns": [{"text": "one"}, {"text": "two"}]}]},
        node={"capacity": {"run": 1, "ahead": 0}},
    )
    with stack.client() as client:
        task_id = submit(client, agent_task(tmp_path), shell_harness("twice"), max_resamples=1)
        result = client.wait(task_id, timeout_s=120)

    failed, replacement = result.results
    assert result.replaced == [failed.session_id]
    assert failed.status is SessionStatus.ERROR and failed.failure is FailureReason.ENGINE
    assert (failed.error or "").startswith("the session's last model call failed (engine_http")
    assert len(failed.samples) == 1, "the answered call's trace is kept, not trained"
    assert replacement.status is SessionStatus.COMPLETED and replacement.failure is None
    assert replacement.reward == 1.0


def test_an_evaluator_crash_ends_the_session_error_with_the_reason(
    make_rollout: Callable[..., RolloutStack], tmp_path: Path
) -> None:
    stack = make_rollout(scripts(1), node={"policy": {"plugins": ["support.agents:crashing"]}})
    task = agent_task(tmp_path, evaluator=EvaluatorSpec(kind="support.agents:crashing"))
    with stack.client() as client:
        task_id = submit(client, task, shell_harness("ok"))
        session = only(client.wait(task_id, timeout_s=60))

    assert session.status is SessionStatus.ERROR
    assert session.failure is FailureReason.EVALUATOR
    assert session.error == (
        "evaluator support.agents:crashing crashed: RuntimeError: the evaluator fell over"
    )
    assert session.reward is None
    assert len(session.samples) == 1, "the trajectory is kept for inspection"


def test_a_restarted_server_resumes_its_in_flight_task(
    make_rollout: Callable[..., RolloutStack], tmp_path: Path
) -> None:
    """The server stops while both sessions run; the node keeps running them and
    re-registers with the new server, which takes their results."""
    stack = make_rollout(scripts(2))
    with stack.client() as client:
        task_id = submit(client, agent_task(tmp_path), shell_harness("slow", "3"), num_samples=2)
        for index in range(2):
            wait_until(lambda i=index: started(stack, f"{task_id}-s{i}"), what="both agents")
    stack.stop_server()
    time.sleep(1.0)
    stack.start_server()  # same database; the node finds the new server on its next heartbeat

    with stack.client() as client:
        result = client.wait(task_id, timeout_s=120)

    assert result.status is TaskStatus.COMPLETED
    assert [r.status for r in result.results] == [SessionStatus.COMPLETED] * 2
    assert [r.reward for r in result.results] == [1.0, 1.0]


def test_a_restarted_server_reports_sessions_whose_node_never_returns(
    make_rollout: Callable[..., RolloutStack], tmp_path: Path
) -> None:
    stack = make_rollout(scripts(1), server={"node_timeout_s": 1.0})
    with stack.client() as client:
        task_id = submit(client, agent_task(tmp_path), shell_harness("slow", "60"))
        wait_until(lambda: started(stack, f"{task_id}-s0"), what="the agent")
    stack.stop_server()
    stack.stop_node()  # the node goes away for good
    stack.start_server()

    with stack.client() as client:
        result = client.wait(task_id, timeout_s=30)

    session = only(result)
    assert session.status is SessionStatus.ERROR
    assert session.failure is FailureReason.NODE_LOST
    assert session.error == f"node {stack.node_config.node_id} stopped answering"
    assert result.status is TaskStatus.FAILED and result.usable == 0


def test_early_stop_cancels_the_rest_once_enough_sessions_are_usable(
    make_rollout: Callable[..., RolloutStack], tmp_path: Path
) -> None:
    stack = make_rollout(scripts(4), node={"capacity": {"run": 2, "ahead": 0}})
    with stack.client() as client:
        task_id = submit(
            client, agent_task(tmp_path), shell_harness("ok"), num_samples=4, early_stop_at=2
        )
        result = client.wait(task_id, timeout_s=120)

    statuses = sorted(r.status.value for r in result.results)
    assert statuses.count("completed") >= 2
    assert "cancelled" in statuses, statuses
    assert result.usable >= 2


def test_failed_sessions_are_resampled_to_fill_the_group(
    make_rollout: Callable[..., RolloutStack], tmp_path: Path
) -> None:
    stack = make_rollout(scripts(4))
    with stack.client() as client:
        task_id = submit(
            client, agent_task(tmp_path), shell_harness("fail"), num_samples=2, max_resamples=2
        )
        result = client.wait(task_id, timeout_s=120)
        view = client.task(task_id)

    assert [r.sample_index for r in result.results] == [0, 1, 2, 3]
    assert all(r.status is SessionStatus.ERROR for r in result.results)
    assert all(r.failure is FailureReason.HARNESS for r in result.results)
    assert len(result.replaced) == 2
    replaced = {s.session_id: s.replaced_by for s in view.sessions if s.replaced_by}
    assert set(replaced.values()) <= {f"{task_id}-s2", f"{task_id}-s3"}


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ("not json", 400, "the body is not valid JSON"),
        ("[]", 400, "the body must be a JSON object"),
        ('{"harness": {"name": "pi"}}', 422, "task: field required"),
    ],
)
def test_bad_submissions_get_one_clear_line_and_create_nothing(
    make_rollout: Callable[..., RolloutStack], body: str, status: int, message: str
) -> None:
    stack = make_rollout(scripts(1))
    with stack.client() as client:
        reply = client._http.post("/tasks", content=body)
        assert reply.status_code == status
        assert reply.json() == {"error": {"type": "invalid_request", "message": message}}
        assert client.tasks() == []
