"""The ``minicoder`` preset end to end: the real program, as a local process, against a
real gateway in front of the scripted engine, on a ``pyfuncs`` task's workspace."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from polar.harness import HarnessRun, InvalidHarnessOptions, RunSpec, load_harness, run_harness
from polar.harness.agents.minicoder import NO_CODE, SYSTEM, code_block
from polar.ir import RecordStatus
from polar.tasks import DirectoryWorkspace
from polar.tasks.pyfuncs import FuncTask, Split, generate, pyfuncs_tasks

from support.stack import Stack

TASK_ID = "pyfuncs/keep-greater/k3"


@pytest.fixture(scope="module")
def func_task() -> FuncTask:
    (task,) = [task for task in generate() if task.id == TASK_ID]
    return task


def fenced(code: str, before: str = "Here is the function:\n\n") -> str:
    return f"{before}```python\n{code}```"


def task_workspace(tmp_path: Path) -> Path:
    """A copy of the task's workspace (its ``examples.py``), as a session starts with."""
    (task,) = [t for t in pyfuncs_tasks(Split.TRAIN, root=tmp_path / "tasks") if t.id == TASK_ID]
    assert isinstance(task.workspace, DirectoryWorkspace)
    return Path(shutil.copytree(task.workspace.path, tmp_path / "work"))


def run_on_task(
    stack: Stack,
    make_spec: Callable[..., RunSpec],
    tmp_path: Path,
    func_task: FuncTask,
    **options: Any,
) -> tuple[HarnessRun, RunSpec, str]:
    """Run minicoder on a copy of the task's workspace; (run, spec, session id)."""
    session_id, key = stack.new_session()
    spec = make_spec(
        gateway_url=stack.url,
        api_key=key,
        instruction=func_task.instruction,
        workdir=task_workspace(tmp_path),
    )
    run = run_harness(load_harness("minicoder", options), spec, cache_dir=tmp_path / "cache")
    return run, spec, session_id


def last_stderr_line(run: HarnessRun) -> str:
    return run.result.stderr.strip().splitlines()[-1]


def test_a_task_solved_in_one_turn(
    make_stack: Callable[..., Stack],
    make_spec: Callable[..., RunSpec],
    tmp_path: Path,
    func_task: FuncTask,
) -> None:
    first_call = {"system_contains": "```python", "messages": 2, "last_role": "user"}
    stack = make_stack({"turns": [{"text": fenced(func_task.reference), "expect": first_call}]})

    run, spec, session_id = run_on_task(stack, make_spec, tmp_path, func_task)

    assert run.result.exit_code == 0, run.result.stderr
    assert last_stderr_line(run) == "minicoder: the check passes after 1 turn(s)"
    assert "turn 1: wrote solution.py (2 lines); check: pass" in run.result.stdout
    assert (spec.workdir / "solution.py").read_text() == func_task.reference
    stack.engine.assert_clean()
    (record,) = stack.records(session_id)
    assert record.status is RecordStatus.COMPLETED
    messages = record.original_request["messages"]
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"] == SYSTEM
    assert messages[1]["content"] == func_task.instruction


def test_a_wrong_first_reply_sees_the_failing_example_and_is_revised(
    make_stack: Callable[..., Stack],
    make_spec: Callable[..., RunSpec],
    tmp_path: Path,
    func_task: FuncTask,
) -> None:
    stack = make_stack(
        {
            "turns": [
                {"text": fenced(func_task.wrong)},
                {
                    "text": fenced(func_task.reference, before=""),
                    "expect": {"messages": 4, "last_text_contains": "The examples fail:"},
                },
            ]
        }
    )

    run, spec, session_id = run_on_task(stack, make_spec, tmp_path, func_task)

    assert run.result.exit_code == 0, run.result.stderr
    assert last_stderr_line(run) == "minicoder: the check passes after 2 turn(s)"
    assert "turn 1: wrote solution.py (2 lines); check: fail: " in run.result.stdout
    assert (spec.workdir / "solution.py").read_text() == func_task.reference
    stack.engine.assert_clean()
    first, second = stack.records(session_id)
    assert first.status is second.status is RecordStatus.COMPLETED
    messages = second.original_request["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[2]["content"].strip() == fenced(func_task.wrong)  # the reply, sent back
    # The failing example, what it returned and what was expected: short.
    feedback = messages[3]["content"]
    assert feedback.startswith(f"The examples fail:\n{func_task.function}(")
    assert ", expected " in feedback and feedback.endswith("```python code block.")
    assert len(feedback) < 300, feedback


def test_a_run_out_of_turns_ends_normally_and_says_so(
    make_stack: Callable[..., Stack],
    make_spec: Callable[..., RunSpec],
    tmp_path: Path,
    func_task: FuncTask,
) -> None:
    stack = make_stack(
        {
            "turns": [
                {"text": fenced(func_task.wrong)},
                {"text": fenced(func_task.wrong), "expect": {"messages": 4}},
            ]
        }
    )

    run, spec, session_id = run_on_task(stack, make_spec, tmp_path, func_task, max_turns=2)

    # Scored by the evaluator like any finished run: exit 0, the reason on stderr.
    assert run.result.exit_code == 0, run.result.stderr
    line = last_stderr_line(run)
    assert line.startswith("minicoder: out of turns (2); the check fails: "), line
    assert (spec.workdir / "solution.py").read_text() == func_task.wrong
    stack.engine.assert_clean()
    assert len(stack.records(session_id)) == 2


def test_a_reply_without_a_code_block_is_told_so(
    make_stack: Callable[..., Stack],
    make_spec: Callable[..., RunSpec],
    tmp_path: Path,
    func_task: FuncTask,
) -> None:
    stack = make_stack(
        {
            "turns": [
                {"text": "You should keep the items that are greater than 3."},
                {
                    "text": fenced(func_task.reference),
                    "expect": {"messages": 4, "last_text_contains": NO_CODE},
                },
            ]
        }
    )

    run, spec, _ = run_on_task(stack, make_spec, tmp_path, func_task)

    assert run.result.exit_code == 0, run.result.stderr
    assert "turn 1: the reply has no code block" in run.result.stdout
    assert last_stderr_line(run) == "minicoder: the check passes after 2 turn(s)"
    assert (spec.workdir / "solution.py").read_text() == func_task.reference
    stack.engine.assert_clean()


def test_a_failed_model_call_exits_3_naming_the_call_and_the_status(
    make_stack: Callable[..., Stack],
    make_spec: Callable[..., RunSpec],
    tmp_path: Path,
    func_task: FuncTask,
) -> None:
    stack = make_stack({"turns": [{"text": fenced(func_task.wrong)}]})
    workdir = task_workspace(tmp_path)
    session_id, key = stack.new_session()
    with stack.admin() as admin:  # the session's key stops working
        admin.delete(f"/admin/sessions/{session_id}").raise_for_status()
    spec = make_spec(gateway_url=stack.url, api_key=key, instruction="x", workdir=workdir)

    run = run_harness(load_harness("minicoder"), spec, cache_dir=tmp_path / "cache")

    assert run.result.exit_code == 3
    line = last_stderr_line(run)
    assert line.startswith("minicoder: model call 1 failed: HTTP 401: "), line
    assert not (workdir / "solution.py").exists()


def test_an_unreachable_gateway_is_tried_again_then_named(
    make_spec: Callable[..., RunSpec], tmp_path: Path
) -> None:
    spec = make_spec(gateway_url="http://127.0.0.1:9", instruction="x")
    harness = load_harness("minicoder", {"attempts": 2})

    run = run_harness(harness, spec, cache_dir=tmp_path / "cache")

    assert run.result.exit_code == 3
    line = last_stderr_line(run)
    assert line.startswith("minicoder: model call 1 failed (2 tries): cannot reach "), line


# -- the preset -----------------------------------------------------------------------------


def test_the_program_and_its_settings_go_into_home_and_run_isolated(
    make_spec: Callable[..., RunSpec],
) -> None:
    spec = make_spec()
    harness = load_harness("minicoder", {"max_turns": 5, "python": "python3"})

    written = harness.write_config(spec)
    argv = harness.invocation(spec, None).argv

    assert [path.name for path in written] == ["minicoder.py", "minicoder.json"]
    assert argv == (
        "python3", "-I", str(spec.home / "minicoder.py"),
        "--config", str(spec.home / "minicoder.json"), "--", spec.instruction,
    )  # fmt: skip
    assert '"max_turns": 5' in (spec.home / "minicoder.json").read_text()
    program = (spec.home / "minicoder.py").read_text()
    imports = {line.split()[1] for line in program.splitlines() if line.startswith("import ")}
    assert "polar" not in " ".join(imports)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_turns": 0}, "max_turns must be at least 1"),
        ({"file": "../outside.py"}, "file must be a path inside the workspace"),
        ({"file": "/etc/passwd"}, "file must be a path inside the workspace"),
        ({"check": "python 'unclosed"}, "check: No closing quotation"),
        ({"check_timeout_s": 0}, "check_timeout_s must be positive"),
    ],
)
def test_unusable_options_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidHarnessOptions, match=message):
        load_harness("minicoder", options)


# -- reading the reply --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "code"),
    [
        ("```python\ndef f():\n    return 1\n```\nThis returns 1.", "def f():\n    return 1\n"),
        ("```\ndef f(): pass\n```", "def f(): pass\n"),
        ("```py\nx = 1\n```", "x = 1\n"),
        ("```python\nprint(f())\n```\n```python\ndef f(): pass\n```", "def f(): pass\n"),
        ("```bash\nls\n```\n```python\ndef f(): pass\n```", "def f(): pass\n"),
        ("Sure!\n```python\ndef f():\n    return 2", "def f():\n    return 2\n"),
        ("~~~python\ndef f(): pass\n~~~", "def f(): pass\n"),
        ("````python\ns = '```'\n````", "s = '```'\n"),
    ],
)
def test_the_code_block_is_found(reply: str, code: str) -> None:
    assert code_block(reply) == code


@pytest.mark.parametrize(
    "reply", ["def f(): pass", "```bash\nls\n```", "```python\n```", "Use `x > 3`."]
)
def test_a_reply_without_python_code_has_none(reply: str) -> None:
    assert code_block(reply) is None
