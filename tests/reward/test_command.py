"""The ``command`` evaluator in a real sandbox: exit status, reward file, hidden
tests, timeouts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from polar.reward import EvalResult, EvaluatorError, evaluate
from polar.tasks import DirectoryWorkspace, EvaluatorSpec, Task

from support.workspaces import Sessions, agent, exists, with_sessions, write_tree

CHECK = """\
import calc

assert calc.double(21) == 42, calc.double(21)
print("double is right")
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    write_tree(tmp_path / "hidden", {"check_double.py": CHECK})
    return write_tree(tmp_path / "repo", {"calc.py": "def double(x):\n    return x + 2\n"})


def command_task(project: Path, **config: Any) -> Task:
    return Task(
        id="double",
        instruction="Fix calc.double.",
        workspace=DirectoryWorkspace(path=project),
        evaluator=EvaluatorSpec(kind="command", config=config),
        hidden_tests=project.parent / "hidden",
    )


def run(tmp_path: Path, task: Task, script: str | None = None) -> EvalResult:
    """A session of ``task`` whose agent runs ``script``, scored."""

    async def scenario(sessions: Sessions) -> EvalResult:
        runtime = await sessions.start(task)
        if script is not None:
            await agent(runtime, task, script)
        return await evaluate(sessions.context(task, runtime))

    return with_sessions(tmp_path / "sessions", scenario)


FIX = "sed -i 's/x + 2/x * 2/' calc.py"


def test_the_exit_status_decides_and_hidden_files_arrive_only_for_scoring(
    tmp_path: Path, project: Path
) -> None:
    task = command_task(
        project,
        command="python checks/check_double.py",
        tests_dir="checks",
        env={"PYTHONPATH": "."},
    )

    async def scenario(sessions: Sessions) -> tuple[EvalResult, EvalResult]:
        unfixed = await sessions.start(task, "unfixed")
        assert not await exists(unfixed, str(unfixed.session_dir / "workspace" / "checks"))
        fixed = await sessions.start(task, "fixed")
        await agent(fixed, task, FIX)
        return (
            await evaluate(sessions.context(task, unfixed)),
            await evaluate(sessions.context(task, fixed)),
        )

    unfixed, fixed = with_sessions(tmp_path / "sessions", scenario)

    assert (unfixed.reward, unfixed.resolved) == (0.0, False)
    assert unfixed.details == {
        "runtime": "live",
        "hardening": "baseline",
        "restored": [],
        "removed": [],
        "exit_code": 1,
    }
    assert "AssertionError: 23" in unfixed.log
    assert (fixed.reward, fixed.resolved) == (1.0, True)
    assert fixed.details == unfixed.details | {"exit_code": 0}
    assert "double is right" in fixed.log


@pytest.mark.parametrize(
    ("written", "reward", "resolved"),
    [
        ("0.25", 0.25, False),
        ("1", 1.0, True),
        (" 1.0\n", 1.0, True),
        ("7", 1.0, True),
        ("-2", 0.0, False),
    ],
)
def test_a_reward_file_holds_the_reward_clamped_to_zero_and_one(
    tmp_path: Path, project: Path, written: str, reward: float, resolved: bool
) -> None:
    task = command_task(
        project,
        command=f"printf '%s' '{written}' > out/reward.txt; exit 3",
        reward_file="out/reward.txt",
    )

    result = run(tmp_path, task, "mkdir out")

    assert (result.reward, result.resolved) == (reward, resolved)
    assert result.details["raw_reward"] == float(written)
    assert result.details["exit_code"] == 3


def test_a_reward_file_left_by_the_agent_does_not_count(tmp_path: Path, project: Path) -> None:
    task = command_task(project, command="true", reward_file="reward.txt")

    result = run(tmp_path, task, "echo 1 > reward.txt")

    assert (result.reward, result.resolved) == (0.0, False)
    assert result.details["reason"] == "the command wrote no reward file reward.txt"


def test_a_reward_file_without_a_number_is_an_error(tmp_path: Path, project: Path) -> None:
    task = command_task(project, command="echo great > reward.txt", reward_file="reward.txt")

    with pytest.raises(EvaluatorError) as caught:
        run(tmp_path, task)

    assert str(caught.value) == "reward file reward.txt does not hold a number: b'great\\n'"


def test_a_command_that_runs_too_long_scores_zero_with_the_reason(
    tmp_path: Path, project: Path
) -> None:
    task = command_task(project, command="echo started; sleep 60", timeout_s=0.5)

    result = run(tmp_path, task)

    assert (result.reward, result.resolved) == (0.0, False)
    assert result.details["timed_out"] is True
    assert result.details["timed_out_stage"] == "command"
    assert result.details["reason"] == "command timed out"
    assert "started" in result.log


def test_the_command_gets_its_environment(tmp_path: Path, project: Path) -> None:
    task = command_task(project, command='test "$EXPECTED" = yes', env={"EXPECTED": "yes"})

    assert run(tmp_path, task).reward == 1.0
