"""Evaluators by name or ``package.module:factory``, and how ``evaluate`` reports
every way scoring can fail: one clear line, as an :class:`EvaluatorError`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from polar.reward import (
    EVALUATORS,
    EvalContext,
    EvaluatorError,
    EvaluatorTimeout,
    InvalidEvaluatorConfig,
    UnknownEvaluator,
    evaluate,
    load_evaluator,
)
from polar.reward.command import CommandEvaluator
from polar.reward.harbor import HarborEvaluator
from polar.reward.pytest_suite import PytestEvaluator
from polar.reward.swebench import SwebenchEvaluator
from polar.tasks import DirectoryWorkspace, EvaluatorSpec, Task

from support.evaluators import AnswerFile
from support.workspaces import Sessions, agent, with_sessions, write_tree


def spec(kind: str, **config: Any) -> EvaluatorSpec:
    return EvaluatorSpec(kind=kind, config=config)


def task_with(evaluator: EvaluatorSpec, workspace: Path) -> Task:
    return Task(
        id="answer",
        instruction="Write the answer to answer.txt.",
        workspace=DirectoryWorkspace(path=workspace),
        evaluator=evaluator,
    )


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return write_tree(tmp_path / "repo", {"README.md": "Put 42 into answer.txt.\n"})


def score(tmp_path: Path, task: Task, answer: str | None = None, timeout_s: float = 30.0) -> Any:
    """Run a session of ``task`` whose agent writes ``answer``, then ``evaluate`` it."""

    async def scenario(sessions: Sessions) -> Any:
        runtime = await sessions.start(task)
        if answer is not None:
            await agent(runtime, task, f"echo {answer} > answer.txt")
        return await evaluate(sessions.context(task, runtime, timeout_s=timeout_s))

    return with_sessions(tmp_path / "sessions", scenario)


@pytest.mark.parametrize(
    ("name", "config", "kind"),
    [
        ("command", {"command": "true"}, CommandEvaluator),
        ("pytest", {}, PytestEvaluator),
        ("swebench", {"fail_to_pass": ["tests/test_a.py::test_a"]}, SwebenchEvaluator),
        ("harbor", {}, HarborEvaluator),
    ],
)
def test_every_built_in_loads_by_name(name: str, config: dict[str, Any], kind: type) -> None:
    assert name in EVALUATORS
    assert isinstance(load_evaluator(spec(name, **config)), kind)


def test_config_values_are_validated_and_converted() -> None:
    evaluator = load_evaluator(spec("pytest", reward="fraction", args=["-x"], timeout_s="5"))

    assert isinstance(evaluator, PytestEvaluator)
    assert evaluator.reward.value == "fraction"
    assert evaluator.args == ("-x",)
    assert evaluator.timeout_s == 5.0


@pytest.mark.parametrize(
    ("evaluator", "message"),
    [
        (
            spec("pytest", rewards="fraction"),
            "evaluator pytest: unknown config ['rewards']; it takes ['args', 'env', 'pytest', "
            "'required', 'reward', 'select', 'tests_dir', 'timeout_s']",
        ),
        (
            spec("pytest", reward="sometimes"),
            "evaluator pytest: reward: Input should be 'pass_fail' or 'fraction'",
        ),
        (spec("command"), "evaluator command: command: Field required"),
        (
            spec("command", command=""),
            "evaluator command: command: String should have at least 1 character",
        ),
        (
            spec("swebench", fail_to_pass=[]),
            "evaluator swebench: fail_to_pass: Tuple should have at least 1 item after "
            "validation, not 0",
        ),
        (
            spec("harbor", verifier_timeout_s=-1),
            "evaluator harbor: verifier_timeout_s: Input should be greater than 0",
        ),
        (
            spec("support.evaluators:AnswerFile", expected="42", typo=1),
            "evaluator support.evaluators:AnswerFile: unknown config ['typo']; "
            "it takes ['expected', 'path']",
        ),
        (
            spec("support.evaluators:fixed", rewardd=1),
            "evaluator support.evaluators:fixed: fixed() got an unexpected keyword argument "
            "'rewardd'",
        ),
    ],
)
def test_an_invalid_config_is_one_clear_line(evaluator: EvaluatorSpec, message: str) -> None:
    with pytest.raises(InvalidEvaluatorConfig) as caught:
        load_evaluator(evaluator)

    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        (
            "pytset",
            "unknown evaluator 'pytset'; use one of ['command', 'harbor', 'pytest', 'swebench'] "
            "or 'package.module:factory'",
        ),
        (
            "no_such_package.graders:exact",
            "evaluator no_such_package.graders:exact: cannot import no_such_package.graders "
            "(No module named 'no_such_package')",
        ),
        (
            "support.evaluators:missing",
            "evaluator support.evaluators:missing: support.evaluators has no callable 'missing'",
        ),
        (
            "support.evaluators:NOT_CALLABLE",
            "evaluator support.evaluators:NOT_CALLABLE: support.evaluators has no callable "
            "'NOT_CALLABLE'",
        ),
        (
            "support.evaluators:not_an_evaluator",
            "evaluator support.evaluators:not_an_evaluator returned dict, which has no "
            "async evaluate(ctx)",
        ),
    ],
)
def test_an_unknown_evaluator_is_one_clear_line(kind: str, message: str) -> None:
    with pytest.raises(UnknownEvaluator) as caught:
        load_evaluator(spec(kind))

    assert str(caught.value) == message


def test_an_evaluator_of_your_own_scores_in_the_session_runtime(
    tmp_path: Path, workspace: Path
) -> None:
    task = task_with(spec("support.evaluators:AnswerFile", expected="42"), workspace)

    right = score(tmp_path / "right", task, answer="42")
    wrong = score(tmp_path / "wrong", task, answer="41")

    assert (right.reward, right.resolved, right.details) == (1.0, True, {"answer": "42"})
    assert (wrong.reward, wrong.resolved, wrong.details) == (0.0, False, {"answer": "41"})
    assert isinstance(load_evaluator(task.evaluator), AnswerFile)


def test_a_function_factory_gets_the_config_as_keyword_arguments(
    tmp_path: Path, workspace: Path
) -> None:
    result = score(tmp_path, task_with(spec("support.evaluators:fixed", reward=0.5), workspace))

    assert (result.reward, result.resolved) == (0.5, False)


def test_an_evaluator_that_crashes_is_an_error_with_the_reason(
    tmp_path: Path, workspace: Path
) -> None:
    task = task_with(spec("support.evaluators:crashing"), workspace)

    with pytest.raises(EvaluatorError) as caught:
        score(tmp_path, task)

    assert str(caught.value) == (
        "evaluator support.evaluators:crashing crashed: "
        "RuntimeError: the grader's database is unreachable"
    )
    assert isinstance(caught.value.__cause__, RuntimeError)


@pytest.mark.parametrize("reward", [1.5, -0.1, float("nan")])
def test_a_reward_outside_zero_to_one_is_an_error(
    tmp_path: Path, workspace: Path, reward: float
) -> None:
    task = task_with(spec("support.evaluators:fixed", reward=reward), workspace)

    with pytest.raises(EvaluatorError, match=r"returned reward .* not in \[0, 1\]"):
        score(tmp_path, task)


def test_an_evaluator_that_ignores_its_budget_is_cancelled(tmp_path: Path, workspace: Path) -> None:
    task = task_with(spec("support.evaluators:hanging"), workspace)

    with pytest.raises(EvaluatorTimeout) as caught:
        score(tmp_path, task, timeout_s=0.5)

    assert str(caught.value) == (
        "evaluator support.evaluators:hanging did not finish within its budget of 0.5 s "
        "(the task's evaluator.timeout_s)"
    )


def test_a_runtime_that_is_gone_is_an_error_not_a_zero(tmp_path: Path, workspace: Path) -> None:
    task = task_with(spec("command", command="true"), workspace)

    async def scenario(sessions: Sessions) -> None:
        runtime = await sessions.start(task)
        await runtime.stop()
        ctx: EvalContext = sessions.context(task, runtime)
        with pytest.raises(EvaluatorError, match=r"^evaluator command: runtime failure: "):
            await evaluate(ctx)

    with_sessions(tmp_path / "sessions", scenario)


def test_a_given_evaluator_is_used_instead_of_the_tasks(tmp_path: Path, workspace: Path) -> None:
    task = task_with(spec("command", command="exit 1"), workspace)

    async def scenario(sessions: Sessions) -> float:
        runtime = await sessions.start(task)
        await agent(runtime, task, "echo 42 > answer.txt")
        result = await evaluate(sessions.context(task, runtime), AnswerFile(expected="42"))
        return result.reward

    assert with_sessions(tmp_path / "sessions", scenario) == 1.0
