"""Tasks through the whole rollout service: submitted to a real rollout server,
run as a group of sessions on a real gateway node, each in its own bubblewrap
sandbox. Only the model is scripted (no GPU here). A built-in task with real,
unmodified agent CLIs: two sessions are scripted to apply the task's correct
fix and two a wrong one, and the rewards must say which is which. A
``pyfuncs`` task with the ``minicoder`` preset: solved at once, solved after
seeing the failing example, and out of turns."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from polar.rollout.protocol import HarnessSpec, SessionStatus, TaskStatus, TaskSubmission
from polar.tasks.builtin import builtin_task
from polar.tasks.pyfuncs import Case, FuncTask, Split, generate, pyfuncs_tasks

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


MINICODER_TASK = "pyfuncs/keep-greater/k3"


def case_passes(code: str, function: str, case: Case) -> bool:
    """Whether ``code``'s ``function`` returns a hidden case's expected value."""
    namespace: dict[str, Any] = {}
    exec(compile(code, "solution.py", "exec"), namespace)
    try:
        return bool(namespace[function](*copy.deepcopy(case.args)) == case.expected)
    except Exception:
        return False


def minicoder_scripts(task: FuncTask) -> dict[str, Any]:
    """Per-session scripts: right at once; wrong, then right; wrong twice."""

    def reply(code: str) -> dict[str, Any]:
        return {"text": f"```python\n{code}```"}

    return {
        "sessions": [
            {"turns": [reply(task.reference)]},
            {"turns": [reply(task.wrong), reply(task.reference)]},
            {"turns": [reply(task.wrong), reply(task.wrong)]},
        ]
    }


@pytest.mark.slow
def test_minicoder_sessions_on_a_pyfuncs_task_are_scored_by_the_pytest_evaluator(
    make_rollout: Callable[..., RolloutStack], tmp_path: Path
) -> None:
    (func,) = [task for task in generate() if task.id == MINICODER_TASK]
    (task,) = [
        task for task in pyfuncs_tasks(Split.TRAIN, root=tmp_path / "tasks") if task.id == func.id
    ]
    stack = make_rollout(minicoder_scripts(func))
    with stack.client() as client:
        view = client.submit(
            TaskSubmission(
                task=task,
                harness=HarnessSpec(name="minicoder", options={"max_turns": 2}),
                num_samples=3,
                session_timeout_s=120,
            )
        )
        result = client.wait(view.task_id, timeout_s=300)

    assert result.status is TaskStatus.COMPLETED
    scripted = stack.engine.assignments
    # The reward is the fraction of hidden cases passed: the wrong body gets some.
    wrong = sum(case_passes(func.wrong, func.function, case) for case in func.hidden)
    partly = wrong / len(func.hidden)
    assert 0 < partly < 1
    expected = [  # reward, model calls, how the agent ended
        (1.0, 1, "minicoder: the check passes after 1 turn(s)"),
        (1.0, 2, "minicoder: the check passes after 2 turn(s)"),
        (partly, 2, "minicoder: out of turns (2); the check fails: "),
    ]
    for r in result.results:
        reward, calls, ended = expected[scripted[r.session_id]]
        details = (r.status, r.error, r.agent, r.evaluation.get("log"))
        assert r.status is SessionStatus.COMPLETED, details
        assert r.reward == pytest.approx(reward), details
        assert r.resolved is (reward == 1.0), details
        assert r.agent["exit_code"] == 0
        assert r.agent["stderr_tail"].strip().splitlines()[-1].startswith(ended), details
        assert r.records == calls
        # Token-in/token-out: the turns of a session merge into one trainer sample.
        (sample,) = r.samples
        assert sample["reward"] == pytest.approx(reward)
        assert len(sample["source_records"]) == calls and sample["break_reason"] is None
        assert len(r.evaluation["details"]["tests"]) == len(func.hidden)
    assert result.mean_reward == pytest.approx((2 + partly) / 3)
    stack.engine.assert_clean()
