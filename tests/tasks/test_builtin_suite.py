"""Every built-in task, for real: untouched -> 0, its solution -> 1, its wrong patch -> 0."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from polar.reward import EvalResult, evaluate
from polar.runtime import Runtime
from polar.tasks import (
    DirectoryWorkspace,
    TaskLoadError,
    builtin_task,
    builtin_tasks,
    load_tasks,
    solution_patch,
    workspace_path,
    wrong_patch,
)
from polar.tasks.builtin import BUILTIN_DIR

from support.workspaces import Sessions, agent, exists, patch_command, with_sessions

TASK_IDS = [task.id for task in builtin_tasks()]


def test_the_suite_loads_by_name_and_every_task_is_its_directory() -> None:
    tasks = load_tasks("builtin")

    assert [task.id for task in tasks] == TASK_IDS
    assert len(TASK_IDS) >= 8
    for task in tasks:
        assert task.workspace == DirectoryWorkspace(path=BUILTIN_DIR / task.id / "repo")
        assert task.hidden_tests == BUILTIN_DIR / task.id / "hidden_tests"
        assert task.evaluator.kind == "pytest"


def test_an_unknown_task_names_the_known_ones() -> None:
    with pytest.raises(TaskLoadError, match=r"no built-in task 'fix-nothing'; there are \["):
        builtin_task("fix-nothing")


@pytest.mark.parametrize("task_id", TASK_IDS)
def test_the_instruction_names_only_files_that_exist(task_id: str) -> None:
    task = builtin_task(task_id)
    repo = BUILTIN_DIR / task_id / "repo"
    named = re.findall(r"`([\w/]+\.py)`", task.instruction)

    assert all((repo / path).is_file() for path in named), named


@pytest.mark.parametrize("task_id", TASK_IDS)
def test_hidden_tests_never_overwrite_a_file_of_the_repository(task_id: str) -> None:
    hidden = BUILTIN_DIR / task_id / "hidden_tests"
    repo = BUILTIN_DIR / task_id / "repo"
    files = [p.relative_to(hidden) for p in hidden.rglob("*.py") if "__pycache__" not in p.parts]

    assert files
    assert not [path for path in files if (repo / path).exists()]


@pytest.mark.parametrize("task_id", TASK_IDS)
def test_untouched_is_zero_solution_is_one_wrong_patch_is_zero(
    tmp_path: Path, task_id: str
) -> None:
    task = builtin_task(task_id)
    assert task.hidden_tests is not None
    hidden = sorted(
        p.relative_to(task.hidden_tests).as_posix() for p in task.hidden_tests.rglob("test_*.py")
    )

    async def session(sessions: Sessions, name: str, patch: str | None) -> EvalResult:
        runtime = await sessions.start(task, name)
        for path in hidden:
            assert not await exists(runtime, f"{workspace_path(task, runtime)}/{path}")
        if patch is not None:
            await agent(runtime, task, patch_command(patch))
        if name == "solution":
            await repository_tests_pass(runtime)
        return await evaluate(sessions.context(task, runtime))

    async def repository_tests_pass(runtime: Runtime) -> None:
        # The solution keeps the project's own tests green, with plain `pytest` too.
        result = await runtime.exec(
            ["pytest", "-q", "-p", "no:cacheprovider"], cwd=workspace_path(task, runtime)
        )
        assert result.ok, result.stdout + result.stderr

    async def scenario(sessions: Sessions) -> list[EvalResult]:
        return await asyncio.gather(
            session(sessions, "untouched", None),
            session(sessions, "solution", solution_patch(task_id)),
            session(sessions, "wrong", wrong_patch(task_id)),
        )

    untouched, solved, wrong = with_sessions(tmp_path, scenario)

    assert (untouched.reward, untouched.resolved) == (0.0, False), untouched.log
    assert (solved.reward, solved.resolved) == (1.0, True), solved.log
    assert (wrong.reward, wrong.resolved) == (0.0, False), wrong.log
    # The wrong patch is plausible: it fails some hidden tests, not all of them.
    outcomes = set(wrong.details["tests"].values())
    assert outcomes == {"passed", "failed"}, wrong.details["tests"]
    assert set(solved.details["tests"]) == set(wrong.details["tests"])


FORCE_PASS = """\
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
"""

FAKE_PYTEST = """\
import os
import sys

for arg in sys.argv:
    if arg.startswith("--junitxml="):
        path = arg.split("=", 1)[1]
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as report:
            report.write('<testsuite><testcase classname="t" name="t" file="t.py"/></testsuite>')
"""


def test_the_usual_reward_hacks_do_not_pay(tmp_path: Path) -> None:
    # A shadowing pytest.py writing a passing report, a conftest.py and an
    # addopts plug-in that turn every failure into a pass.
    task = builtin_task("fix-median")
    hack = (
        f"cat > conftest.py <<'EOF'\n{FORCE_PASS}EOF\n"
        f"cp conftest.py tests/conftest.py && cp conftest.py force_pass.py\n"
        f"cat > pytest.py <<'EOF'\n{FAKE_PYTEST}EOF\n"
        "printf 'addopts = \"-p force_pass\"\\n' >> pyproject.toml\n"
    )

    async def scenario(sessions: Sessions) -> EvalResult:
        runtime = await sessions.start(task)
        await agent(runtime, task, hack)
        return await evaluate(sessions.context(task, runtime))

    result = with_sessions(tmp_path, scenario)

    assert (result.reward, result.resolved) == (0.0, False)
    assert "failed" in result.details["tests"].values()
