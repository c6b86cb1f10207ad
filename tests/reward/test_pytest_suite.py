"""The ``pytest`` evaluator in a real sandbox: hidden tests, per-test outcomes,
pass/fail and fraction, collection errors, timeouts, fresh copies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from polar.reward import EvalResult, EvaluatorError, evaluate
from polar.tasks import DirectoryWorkspace, EvaluatorSpec, Task, workspace_path

from support.workspaces import Sessions, agent, exists, git, with_sessions, write_tree

CALC = """\
def add(a, b):
    return a + b


def sub(a, b):
    return a - b


def mul(a, b):
    return a + b
"""

HIDDEN_TESTS = """\
import calc


def test_add():
    assert calc.add(2, 3) == 5


def test_sub():
    assert calc.sub(2, 3) == -1


def test_mul():
    assert calc.mul(2, 3) == 6
"""

FIX = f"cat > calc.py <<'EOF'\n{CALC[: CALC.rindex('a + b')]}a * b\nEOF\n"
"""A one-step agent that fixes ``mul``."""


def calc_task(tmp_path: Path, hidden: dict[str, str] | None = None, **options: Any) -> Task:
    """A tiny project whose ``mul`` is wrong; ``options``: the evaluator's config,
    plus ``fresh_runtime``."""
    fresh = options.pop("fresh_runtime", False)
    write_tree(tmp_path / "hidden", hidden or {"test_calc.py": HIDDEN_TESTS})
    return Task(
        id="calc",
        instruction="Fix calc.mul.",
        workspace=DirectoryWorkspace(path=write_tree(tmp_path / "repo", {"calc.py": CALC})),
        evaluator=EvaluatorSpec(kind="pytest", config=options, fresh_runtime=fresh),
        hidden_tests=tmp_path / "hidden",
    )


def run(tmp_path: Path, task: Task, script: str | None = None) -> EvalResult:
    async def scenario(sessions: Sessions) -> EvalResult:
        runtime = await sessions.start(task)
        if script is not None:
            await agent(runtime, task, script)
        return await evaluate(sessions.context(task, runtime))

    return with_sessions(tmp_path / "sessions", scenario)


UNFIXED = {
    "test_calc.py::test_add": "passed",
    "test_calc.py::test_sub": "passed",
    "test_calc.py::test_mul": "failed",
}


@pytest.mark.parametrize(("mode", "reward"), [("pass_fail", 0.0), ("fraction", 2 / 3)])
def test_per_test_outcomes_and_the_reward_of_each_mode(
    tmp_path: Path, mode: str, reward: float
) -> None:
    result = run(tmp_path, calc_task(tmp_path, reward=mode))

    assert result.reward == pytest.approx(reward)
    assert result.resolved is False
    assert result.details["tests"] == UNFIXED
    assert result.details["reward_mode"] == mode
    assert (result.details["scored"], result.details["passed"]) == (3, 2)
    assert result.details["report"] == "junit"
    assert "FAILED test_calc.py::test_mul" in result.log


@pytest.mark.parametrize("mode", ["pass_fail", "fraction"])
def test_a_fix_scores_one_in_each_mode(tmp_path: Path, mode: str) -> None:
    result = run(tmp_path, calc_task(tmp_path, reward=mode), FIX)

    assert (result.reward, result.resolved) == (1.0, True)
    assert set(result.details["tests"].values()) == {"passed"}


def test_hidden_tests_reach_the_workspace_only_when_it_is_scored(tmp_path: Path) -> None:
    task = calc_task(tmp_path)
    assert task.hidden_tests is not None

    async def scenario(sessions: Sessions) -> None:
        runtime = await sessions.start(task)
        workspace = workspace_path(task, runtime)
        assert not await exists(runtime, f"{workspace}/test_calc.py")
        # Nor can the agent read them where they lie on the host.
        assert not await exists(runtime, str(task.hidden_tests / "test_calc.py"))
        await evaluate(sessions.context(task, runtime))
        assert await exists(runtime, f"{workspace}/test_calc.py")

    with_sessions(tmp_path / "sessions", scenario)


def test_an_agents_file_named_like_a_hidden_test_is_replaced(tmp_path: Path) -> None:
    fake = "def test_add():\n    pass\n\ndef test_sub():\n    pass\n\ndef test_mul():\n    pass\n"

    result = run(tmp_path, calc_task(tmp_path), f"cat > test_calc.py <<'EOF'\n{fake}EOF\n")

    assert result.reward == 0.0
    assert result.details["tests"] == UNFIXED


def test_a_file_that_fails_to_collect_is_one_error_and_the_rest_still_run(
    tmp_path: Path,
) -> None:
    hidden = {"test_calc.py": HIDDEN_TESTS, "test_power.py": "from calc import power\n"}

    result = run(tmp_path, calc_task(tmp_path, hidden, reward="fraction"), FIX)

    assert result.details["tests"] == {
        "test_calc.py::test_add": "passed",
        "test_calc.py::test_sub": "passed",
        "test_calc.py::test_mul": "passed",
        "test_power.py": "error",
    }
    assert result.reward == pytest.approx(3 / 4)
    assert result.resolved is False


def test_required_tests_that_did_not_run_count_as_failed(tmp_path: Path) -> None:
    task = calc_task(
        tmp_path, reward="fraction", required=["test_calc.py::test_mul", "test_calc.py::test_div"]
    )

    result = run(tmp_path, task, FIX)

    assert result.reward == pytest.approx(1 / 2)
    assert result.resolved is False
    assert result.details["missing"] == ["test_calc.py::test_div"]
    assert (result.details["scored"], result.details["passed"]) == (2, 1)


def test_select_chooses_the_tests(tmp_path: Path) -> None:
    task = calc_task(tmp_path, select=["test_calc.py::test_add", "test_calc.py::test_sub"])

    result = run(tmp_path, task)

    assert (result.reward, result.resolved) == (1.0, True)
    assert list(result.details["tests"]) == ["test_calc.py::test_add", "test_calc.py::test_sub"]


def test_skipped_tests_are_not_scored(tmp_path: Path) -> None:
    hidden = {
        "test_calc.py": HIDDEN_TESTS
        + "\nimport pytest\n\n\n@pytest.mark.skip\ndef test_later():\n    pass\n"
    }

    result = run(tmp_path, calc_task(tmp_path, hidden), FIX)

    assert result.details["tests"]["test_calc.py::test_later"] == "skipped"
    assert (result.reward, result.details["scored"]) == (1.0, 3)


def test_hidden_tests_in_a_subdirectory_get_node_ids_with_classes_and_parameters(
    tmp_path: Path,
) -> None:
    hidden = {
        "tests/test_more.py": (
            "import pytest\nimport calc\n\n\nclass TestMul:\n"
            "    @pytest.mark.parametrize('a', [1, 2])\n"
            "    def test_by_one(self, a):\n        assert calc.mul(a, 1) == a\n"
        )
    }

    result = run(tmp_path, calc_task(tmp_path, hidden))

    assert result.details["tests"] == {
        "tests/test_more.py::TestMul::test_by_one[1]": "failed",
        "tests/test_more.py::TestMul::test_by_one[2]": "failed",
    }


def test_no_tests_at_all_scores_zero_with_the_reason(tmp_path: Path) -> None:
    result = run(tmp_path, calc_task(tmp_path, {"test_calc.py": "import calc\n"}))

    assert (result.reward, result.resolved) == (0.0, False)
    assert result.details["reason"] == "no tests ran (pytest exit 5)"


def test_tests_that_run_too_long_score_zero_with_the_reason(tmp_path: Path) -> None:
    hidden = {"test_slow.py": "import time\n\n\ndef test_slow():\n    time.sleep(60)\n"}

    result = run(tmp_path, calc_task(tmp_path, hidden, timeout_s=1))

    assert (result.reward, result.resolved) == (0.0, False)
    assert result.details["timed_out"] is True
    assert result.details["timed_out_stage"] == "pytest"
    assert result.details["reason"] == "pytest timed out"


def test_pytest_that_cannot_run_is_an_error(tmp_path: Path) -> None:
    task = calc_task(tmp_path, pytest=["no-such-pytest"])

    with pytest.raises(EvaluatorError, match=r"^cannot run no-such-pytest: "):
        run(tmp_path, task)


def test_a_task_with_an_empty_hidden_tests_directory_is_an_error(tmp_path: Path) -> None:
    task = calc_task(tmp_path, {"README.md": "no tests here"})

    with pytest.raises(EvaluatorError, match=r"^task calc: no test files in "):
        run(tmp_path, task)


def test_with_a_fresh_runtime_the_agents_diff_is_scored_in_a_clean_copy(tmp_path: Path) -> None:
    task = calc_task(tmp_path, fresh_runtime=True)

    async def scenario(sessions: Sessions) -> EvalResult:
        runtime = await sessions.start(task)
        await agent(runtime, task, f"{FIX}mkdir -p build && echo junk > build/out.txt")
        result = await evaluate(sessions.context(task, runtime))
        live, fresh = (Path(workspace_path(task, r)) for r in sessions.runtimes)
        # Scored in the fresh copy: the hidden tests went there, not to the live one.
        assert not (live / "test_calc.py").exists()
        assert (fresh / "test_calc.py").exists()
        assert (fresh / "calc.py").read_text() == (live / "calc.py").read_text()
        assert git(fresh, "status", "--porcelain", "--", "calc.py") == "M calc.py"
        return result

    result = with_sessions(tmp_path / "sessions", scenario)

    assert (result.reward, result.resolved) == (1.0, True)
    assert result.details["runtime"] == "fresh"
    assert result.details["apply"] == "git_apply"
    assert result.details["diff_files"] == ["build/out.txt", "calc.py"]
