"""The ``swebench`` evaluator on a tiny instance made here: a git repository at a
base commit, a test patch, FAIL_TO_PASS and PASS_TO_PASS, scored in real sandboxes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from polar.reward import EvalResult, EvaluatorError, evaluate
from polar.runtime import Runtime
from polar.tasks import GitWorkspace, Task, load_swebench, workspace_path

from support.workspaces import Sessions, agent, commit_tree, git, shell, with_sessions

CALC = """\
def add(a, b):
    return a + b


def mul(a, b):
    result = 0
    for _ in range(a):
        result += b
    return result if a < 10 else -1
"""

FIXED = """\
def add(a, b):
    return a + b


def mul(a, b):
    return a * b
"""

PARTLY_FIXED = CALC.replace("return result if a < 10 else -1", "return result")
"""Passes test_mul, still fails test_negative (range of a negative number is empty)."""

TEST_CALC = """\
from calc import add


def test_add():
    assert add(2, 3) == 5
"""

TESTS_AFTER = {
    "tests/test_calc.py": TEST_CALC
    + "\n\ndef test_mul():\n    from calc import mul\n\n    assert mul(12, 3) == 36\n",
    "tests/test_negative.py": "from calc import mul\n\n\ndef test_negative():\n"
    "    assert mul(-2, 3) == -6\n",
}

F2P = ["tests/test_calc.py::test_mul", "tests/test_negative.py::test_negative"]
P2P = ["tests/test_calc.py::test_add"]


def write(name: str, text: str) -> str:
    """An agent step writing ``text`` to ``name``."""
    return f"mkdir -p $(dirname {name}) && cat > {name} <<'EOF'\n{text}EOF\n"


@pytest.fixture
def instance(tmp_path: Path) -> dict[str, Any]:
    """An upstream repository (base commit, then the real fix) and its instance row."""
    upstream = tmp_path / "upstream"
    base = commit_tree(
        upstream,
        {
            "calc.py": CALC,
            "tests/test_calc.py": TEST_CALC,
            "pyproject.toml": '[tool.pytest.ini_options]\npythonpath = ["."]\n',
        },
        "base",
    )
    commit_tree(upstream, TESTS_AFTER, "tests for mul")
    test_patch = git(upstream, "diff", base, "HEAD") + "\n"
    commit_tree(upstream, {"calc.py": FIXED}, "fix mul")
    return {
        "instance_id": "acme__calc-7",
        "repo": "acme/calc",
        "base_commit": base,
        "problem_statement": "mul is wrong for large and negative numbers.",
        "test_patch": test_patch,
        "FAIL_TO_PASS": F2P,
        "PASS_TO_PASS": P2P,
        "upstream": str(upstream),
    }


def load(instance: dict[str, Any], setup: tuple[str, ...] = (), **config: Any) -> Task:
    task = load_swebench(instance, repo_url=instance["upstream"], setup=setup)
    if config:
        evaluator = task.evaluator.model_copy(update={"config": task.evaluator.config | config})
        task = task.model_copy(update={"evaluator": evaluator})
    return task


Fresh = Callable[[Sessions, Task], Awaitable[Runtime]]


def run(
    tmp_path: Path, task: Task, script: str | None, fresh: Fresh | None = None
) -> tuple[EvalResult, int]:
    """A session whose agent runs ``script``, scored; and how many runtimes it took."""

    async def scenario(sessions: Sessions) -> tuple[EvalResult, int]:
        runtime = await sessions.start(task)
        if script is not None:
            await agent(runtime, task, script)

        async def own_fresh() -> Runtime:
            assert fresh is not None
            return await fresh(sessions, task)

        ctx = sessions.context(task, runtime, fresh=own_fresh if fresh else None)
        return await evaluate(ctx), len(sessions.runtimes)

    return with_sessions(tmp_path / "sessions", scenario)


def test_the_instance_is_a_checkout_of_the_base_commit(instance: dict[str, Any]) -> None:
    task = load(instance)

    assert task.workspace == GitWorkspace(repo=instance["upstream"], commit=instance["base_commit"])
    assert task.evaluator.fresh_runtime


def test_a_correct_fix_resolves_the_instance_in_a_fresh_checkout(
    tmp_path: Path, instance: dict[str, Any]
) -> None:
    task = load(instance)

    async def scenario(sessions: Sessions) -> EvalResult:
        runtime = await sessions.start(task)
        await agent(runtime, task, write("calc.py", FIXED))
        result = await evaluate(sessions.context(task, runtime))
        live, fresh = (Path(workspace_path(task, r)) for r in sessions.runtimes)
        # The tests ran in the fresh checkout; the agent's own workspace is untouched.
        assert (fresh / "tests" / "test_negative.py").exists()
        assert not (live / "tests" / "test_negative.py").exists()
        assert (fresh / "calc.py").read_text() == FIXED
        return result

    result = with_sessions(tmp_path / "sessions", scenario)

    assert (result.reward, result.resolved) == (1.0, True)
    assert result.details["fail_to_pass"] == dict.fromkeys(F2P, "passed")
    assert result.details["pass_to_pass"] == dict.fromkeys(P2P, "passed")
    assert (result.details["fail_to_pass_passed"], result.details["pass_to_pass_passed"]) == (2, 1)
    assert result.details["diff_files"] == ["calc.py"]
    assert result.details["apply"] == "git_apply"


def test_a_partial_fix_is_not_resolved(tmp_path: Path, instance: dict[str, Any]) -> None:
    result, _ = run(tmp_path, load(instance), write("calc.py", PARTLY_FIXED))

    assert (result.reward, result.resolved) == (0.0, False)
    assert result.details["fail_to_pass"] == {F2P[0]: "passed", F2P[1]: "failed"}
    assert result.details["pass_to_pass"] == {P2P[0]: "passed"}


def test_a_fix_that_breaks_a_passing_test_is_not_resolved(
    tmp_path: Path, instance: dict[str, Any]
) -> None:
    broken = FIXED.replace("return a + b", "return a + b + 1")

    result, _ = run(tmp_path, load(instance), write("calc.py", broken))

    assert result.reward == 0.0
    assert result.details["fail_to_pass"] == dict.fromkeys(F2P, "passed")
    assert result.details["pass_to_pass"] == {P2P[0]: "failed"}


def test_an_empty_diff_scores_zero_without_a_fresh_checkout(
    tmp_path: Path, instance: dict[str, Any]
) -> None:
    # Running the tests leaves caches behind; they are not a change.
    result, runtimes = run(tmp_path, load(instance), "python -m pytest -q tests || true")

    assert (result.reward, result.resolved) == (0.0, False)
    assert result.details["reason"] == "the agent changed nothing (empty diff)"
    assert result.details["diff_files"] == []
    assert runtimes == 1


def test_the_agents_edits_to_the_instance_tests_do_not_count(
    tmp_path: Path, instance: dict[str, Any]
) -> None:
    always_pass = "def test_mul():\n    pass\n\n\ndef test_add():\n    pass\n"
    script = write("tests/test_calc.py", always_pass) + write(
        "tests/test_negative.py", "def test_negative():\n    pass\n"
    )

    result, _ = run(tmp_path, load(instance), script)

    assert result.reward == 0.0
    assert result.details["fail_to_pass"] == dict.fromkeys(F2P, "failed")
    assert result.details["diff_files"] == ["tests/test_calc.py", "tests/test_negative.py"]


def test_a_committed_fix_counts_and_set_up_output_does_not(
    tmp_path: Path, instance: dict[str, Any]
) -> None:
    task = load(instance, setup=("echo generated > build.txt",))
    commit = "git add -A && git -c user.name=a -c user.email=a@b commit -qm fix\n"

    result, _ = run(tmp_path, task, write("calc.py", FIXED) + commit)

    assert (result.reward, result.resolved) == (1.0, True)
    assert result.details["diff_files"] == ["calc.py"]


def test_a_diff_that_does_not_apply_to_the_fresh_checkout_scores_zero(
    tmp_path: Path, instance: dict[str, Any]
) -> None:
    async def drifted(sessions: Sessions, task: Task) -> Runtime:
        runtime = await sessions.start(task)
        await shell(runtime, "printf 'def mul(a, b):\\n    raise ValueError\\n' > calc.py")
        return runtime

    result, _ = run(tmp_path, load(instance), write("calc.py", FIXED), fresh=drifted)

    assert (result.reward, result.resolved) == (0.0, False)
    assert result.details["apply"] is None
    assert result.details["reason"] == "the agent's diff does not apply to a fresh checkout"
    assert "git_apply" in result.log and "patch" in result.log


def test_a_test_id_pytest_does_not_report_counts_as_missing(
    tmp_path: Path, instance: dict[str, Any]
) -> None:
    task = load(instance, fail_to_pass=[*F2P, "tests/test_calc.py::test_typo"])

    result, _ = run(tmp_path, task, write("calc.py", FIXED))

    assert result.reward == 0.0
    assert result.details["fail_to_pass"]["tests/test_calc.py::test_typo"] == "missing"


def test_tests_that_run_too_long_score_zero(tmp_path: Path, instance: dict[str, Any]) -> None:
    slow = (
        "import time\n\n\ndef add(a, b):\n    time.sleep(60)\n"
        + FIXED[FIXED.index("\n\n\ndef mul") :]
    )

    result, _ = run(tmp_path, load(instance, timeout_s=1), write("calc.py", slow))

    assert (result.reward, result.resolved) == (0.0, False)
    assert result.details["timed_out"] is True
    assert result.details["timed_out_stage"] == "tests"
    assert result.details["reason"] == "tests timed out"


def test_a_test_patch_that_does_not_apply_is_an_error(
    tmp_path: Path, instance: dict[str, Any]
) -> None:
    bad_patch = (
        "diff --git a/tests/test_gone.py b/tests/test_gone.py\n"
        "--- a/tests/test_gone.py\n+++ b/tests/test_gone.py\n@@ -1 +1 @@\n-old\n+new\n"
    )

    with pytest.raises(EvaluatorError, match=r"^the instance's test_patch does not apply: "):
        run(tmp_path, load(instance | {"test_patch": bad_patch}), write("calc.py", FIXED))


def test_a_workspace_without_a_baseline_is_an_error(
    tmp_path: Path, instance: dict[str, Any]
) -> None:
    """Without the baseline the node recorded at set-up, the workspace's own ref is
    all there is: an agent that deleted it leaves nothing to diff against."""
    task = load(instance)

    async def scenario(sessions: Sessions) -> EvalResult:
        runtime = await sessions.start(task)
        await agent(runtime, task, "git update-ref -d refs/polar/baseline")
        sessions.baselines.clear()
        return await evaluate(sessions.context(task, runtime))

    with pytest.raises(EvaluatorError, match=r"^cannot take the agent's diff in .*no baseline"):
        with_sessions(tmp_path / "sessions", scenario)


def test_the_agent_cannot_move_or_delete_the_recorded_baseline(
    tmp_path: Path, instance: dict[str, Any]
) -> None:
    """With the node's record, the agent's diff is taken against the set-up's commit
    whatever the agent did to the ref: a fix it committed still counts."""
    moved = (
        "git -c user.name=a -c user.email=a@a commit -qam fix"
        " && git update-ref -d refs/polar/baseline"
    )
    result, _ = run(tmp_path, load(instance), write("calc.py", FIXED) + "\n" + moved)

    assert (result.reward, result.resolved) == (1.0, True)
