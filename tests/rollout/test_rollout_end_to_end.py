"""A built-in task through the whole rollout service: submitted to a real
rollout server, run as a group of 4 sessions on a real gateway node, each in
its own bubblewrap sandbox with a real, unmodified agent CLI. Only the model is
scripted (no GPU here): two sessions are scripted to apply the task's correct
fix and two a wrong one, and the rewards must say which is which."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from polar.rollout.protocol import HarnessSpec, SessionStatus, TaskStatus, TaskSubmission
from polar.tasks.builtin import builtin_task

from support.rollout import RolloutStack, group_script

CORRECT = [True, False, True, False]


@pytest.mark.slow
@pytest.mark.parametrize("harness", ["qwen_code", "mini_swe_agent"])
def test_a_group_of_four_sessions_is_scored_by_what_each_solution_deserves(
    harness: str,
    make_rollout: Callable[..., RolloutStack],
    install_harness: Callable[[str], None],
) -> None:
    install_harness(harness)
    task = builtin_task("fix-median")
    stack = make_rollout(group_script(harness, task.id, CORRECT))
    with stack.client() as client:
        view = client.submit(
            TaskSubmission(
                task=task,
                harness=HarnessSpec(name=harness),
                num_samples=4,
                session_timeout_s=240,
            )
        )
        result = client.wait(view.task_id, timeout_s=600)

    assert result.status is TaskStatus.COMPLETED
    assert len(result.results) == 4
    assignments = stack.engine.assignments
    details = {
        r.session_id: (r.status, r.error, r.agent.get("stderr_tail")) for r in result.results
    }
    for r in result.results:
        assert r.status is SessionStatus.COMPLETED, details
        deserved = 1.0 if CORRECT[assignments[r.session_id]] else 0.0
        assert r.reward == deserved, details
        assert r.resolved is (deserved == 1.0)
        assert r.samples, "every session has a trainer sample"
        sample = r.samples[0]
        assert sample["reward"] == deserved
        assert sample["group_id"] == result.group_id
        assert r.records >= 2
        assert r.timings["running"] > 0
    assert result.usable == 4
    assert result.mean_reward == 0.5
