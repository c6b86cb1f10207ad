"""The ``pyfuncs`` family: it loads by name, splits as designed, and every task is sound.

Soundness is checked twice: directly over every task (the reference passes the
cases written in its hidden tests and its examples, the wrong body fails some),
and through the real ``pytest`` evaluator in a bubblewrap sandbox for one task
of each template (the reference scores 1, the wrong body and the untouched
workspace 0).
"""

from __future__ import annotations

import ast
import asyncio
import collections
import time
from pathlib import Path
from typing import Any

import pytest

from polar.reward import EvalResult, evaluate
from polar.runtime import Runtime
from polar.tasks import DirectoryWorkspace, TaskLoadError, load_tasks, workspace_path
from polar.tasks.model import Task
from polar.tasks.pyfuncs import CHECK, FuncTask, Kind, Split, generate, pyfuncs_tasks, spread
from polar.tasks.pyfuncs.templates import TEMPLATES

from support.workspaces import Sessions, agent, with_sessions

FAMILY = generate()
BY_ID = {task.id: task for task in FAMILY}


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Task]:
    root = tmp_path_factory.mktemp("pyfuncs")
    tasks = [*pyfuncs_tasks(Split.TRAIN, root=root), *pyfuncs_tasks(Split.HELDOUT, root=root)]
    return {task.id: task for task in tasks}


def test_both_splits_load_by_name_with_their_files_written_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)

    train = load_tasks("pyfuncs:train")
    heldout = load_tasks("pyfuncs:heldout")
    again = load_tasks("pyfuncs:train")

    assert len(train) + len(heldout) >= 200
    assert len(heldout) >= 60
    assert again == train
    assert not {task.id for task in train} & {task.id for task in heldout}
    (family_dir,) = (tmp_path / ".cache" / "tasks").iterdir()
    for task in (*train, *heldout):
        assert isinstance(task.workspace, DirectoryWorkspace)
        assert task.workspace.path.is_relative_to(family_dir)
        assert (task.workspace.path / "examples.py").is_file()
        assert task.hidden_tests is not None
        assert (task.hidden_tests / "test_hidden.py").is_file()
        assert task.evaluator.kind == "pytest"
        assert task.metadata["split"] == ("train" if task in train else "heldout")


def test_an_evaluation_set_spreads_over_the_templates_in_a_fixed_order(
    loaded: dict[str, Task],
) -> None:
    heldout = [task for task in loaded.values() if task.metadata["split"] == "heldout"]
    templates = {task.metadata["template"] for task in heldout}
    chosen = spread(heldout, len(templates) + 3)
    assert [task.id for task in chosen] == [task.id for task in spread(heldout, len(chosen))]
    first_round = [task.metadata["template"] for task in chosen[: len(templates)]]
    assert sorted(first_round) == sorted(templates), "one of each template first"
    # each template's own tasks keep their order: its first task comes first
    for task in chosen[: len(templates)]:
        same = [t for t in heldout if t.metadata["template"] == task.metadata["template"]]
        assert task is same[0]
    assert len({task.id for task in chosen}) == len(chosen)
    assert len(spread(heldout, 10_000)) == len(heldout)


def test_a_misspelt_source_names_the_right_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TaskLoadError, match=r"pyfuncs:tran: no such task source .*'pyfuncs:train'"):
        load_tasks("pyfuncs:tran")


def test_generation_is_deterministic_for_a_seed() -> None:
    assert generate() == FAMILY
    other = generate(seed=7)
    assert [task.id for task in other] == [task.id for task in FAMILY]
    assert [task.instruction for task in other] != [task.instruction for task in FAMILY]


def test_ids_and_instructions_are_unique_and_the_prompt_is_short() -> None:
    assert len(BY_ID) == len(FAMILY)
    assert len({task.instruction for task in FAMILY}) == len(FAMILY)
    # A small model's whole prompt is a few hundred tokens: the instruction, a
    # few lines (about 4 characters a token).
    assert max(len(task.instruction) for task in FAMILY) < 700


def test_train_and_heldout_share_no_template_region() -> None:
    train = [task for task in FAMILY if task.split is Split.TRAIN]
    heldout = [task for task in FAMILY if task.split is Split.HELDOUT]
    by_template = {template.name: template for template in TEMPLATES}

    # No (template, parameter point) on both sides, fix tasks included.
    assert not {(t.template, repr(t.params)) for t in train} & {
        (t.template, repr(t.params)) for t in heldout
    }
    for name, template in by_template.items():
        key = template.heldout.key
        trained = [task.params for task in train if task.template == name]
        held = [task.params for task in heldout if task.template == name]
        assert held, f"{name}: nothing held out"
        if key is None:  # a template never trained on
            assert not trained, name
            assert {task.heldout_by for task in heldout if task.template == name} == {"template"}
        else:  # a range of one parameter never trained on, above every trained value
            assert trained, name
            assert max(params[key] for params in trained) < template.heldout.start, name
            assert min(params[key] for params in held) >= template.heldout.start, name
    kinds = collections.Counter(task.heldout_by for task in heldout)
    assert kinds["template"] >= 10 and sum(kinds.values()) - kinds["template"] >= 40, kinds
    print(f"train {len(train)}, held out {len(heldout)}: {dict(kinds)}")


def test_every_template_has_write_tasks_and_some_have_fix_tasks() -> None:
    kinds = collections.Counter((task.template, task.kind) for task in FAMILY)
    for template in TEMPLATES:
        assert kinds[template.name, Kind.WRITE] >= 1
        assert (kinds[template.name, Kind.FIX] >= 1) is template.fixable
    assert sum(task.kind is Kind.FIX for task in FAMILY) >= 50


# ---------------------------------------------------------------- every task, directly


def cases_in(path: Path, name: str) -> list[Any]:
    """The literal list assigned to ``name`` in a generated Python file."""
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == [name]:
            value: list[Any] = ast.literal_eval(node.value)
            return value
    raise AssertionError(f"{path}: no {name}")


def outcome(code: str, function: str, args: tuple[Any, ...]) -> Any:
    namespace: dict[str, Any] = {}
    exec(compile(code, "solution.py", "exec"), namespace)
    try:
        return namespace[function](*args)
    except Exception as exc:
        return exc


def test_every_reference_passes_its_written_cases_and_every_wrong_body_fails_some(
    loaded: dict[str, Task],
) -> None:
    started = time.perf_counter()
    for func in FAMILY:
        task = loaded[func.id]
        assert isinstance(task.workspace, DirectoryWorkspace) and task.hidden_tests
        hidden = cases_in(task.hidden_tests / "test_hidden.py", "CASES")
        examples = cases_in(task.workspace.path / "examples.py", "EXAMPLES")
        assert len(examples) == 3 and len(hidden) >= 10
        assert [args for _, args, _ in examples] == [args for args, _ in hidden[:3]]
        for args, expected in hidden:
            assert outcome(func.reference, func.function, args) == expected, (func.id, args)
        wrong_visible = [
            call
            for call, args, expected in examples
            if outcome(func.wrong, func.function, args) != expected
        ]
        assert wrong_visible, f"{func.id}: the wrong body passes the examples"
        assert f"`{func.function}(" in task.instruction
        solution = task.workspace.path / "solution.py"
        if func.kind is Kind.FIX:
            assert solution.read_text() == func.wrong and func.wrong in task.instruction
        else:
            assert not solution.exists()
    print(f"{len(FAMILY)} tasks checked in {time.perf_counter() - started:.2f} s")


# ---------------------------------------------------------------- through the evaluator


SAMPLE = [
    next(task for task in FAMILY if task.template == template.name and task.kind is kind).id
    for template in TEMPLATES
    for kind in ((Kind.WRITE, Kind.FIX) if template.fixable else (Kind.WRITE,))
][::2]
"""One task per template (its fix task or its write task, alternately)."""


def write_solution(code: str) -> str:
    return f"cat > solution.py <<'POLAR_EOF'\n{code}POLAR_EOF\n"


@pytest.mark.slow
def test_the_evaluator_scores_the_reference_1_and_the_wrong_body_and_the_start_0(
    tmp_path: Path, loaded: dict[str, Task]
) -> None:
    assert len({BY_ID[task_id].template for task_id in SAMPLE}) >= len(TEMPLATES) // 2
    timings: list[float] = []

    async def session(
        sessions: Sessions, func: FuncTask, name: str, code: str | None
    ) -> tuple[EvalResult, int]:
        task = loaded[func.id]
        runtime = await sessions.start(task, f"{func.id.replace('/', '.')}-{name}")
        if code is not None:
            await agent(runtime, task, write_solution(code))
        examples = await check(runtime, task)
        started = time.perf_counter()
        result = await evaluate(sessions.context(task, runtime))
        timings.append(time.perf_counter() - started)
        return result, examples

    async def check(runtime: Runtime, task: Task) -> int:
        result = await runtime.exec(CHECK.split(), cwd=workspace_path(task, runtime))
        return result.exit_code

    async def scenario(sessions: Sessions) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for task_id in SAMPLE:
            func = BY_ID[task_id]
            out[task_id] = await asyncio.gather(
                session(sessions, func, "untouched", None),
                session(sessions, func, "reference", func.reference),
                session(sessions, func, "wrong", func.wrong),
            )
        return out

    results = with_sessions(tmp_path, scenario)

    for task_id, (
        (untouched, u_examples),
        (solved, s_examples),
        (wrong, w_examples),
    ) in results.items():
        assert (solved.reward, solved.resolved) == (1.0, True), (task_id, solved.log)
        assert s_examples == 0, task_id
        # The reward is the fraction of hidden cases passed: a wrong body that gets
        # some right scores below 1, never solved.
        tests = wrong.details["tests"]
        passed = sum(outcome == "passed" for outcome in tests.values())
        assert wrong.reward == pytest.approx(passed / len(tests)), (task_id, wrong.log)
        assert wrong.reward < 1 and not wrong.resolved, task_id
        assert w_examples == 1, task_id
        assert "failed" in tests.values(), task_id
        # Untouched: a write task has no function yet (0); a fix task starts from the
        # wrong body (what it scores).
        start = 0.0 if BY_ID[task_id].kind is Kind.WRITE else wrong.reward
        assert (untouched.reward, u_examples) == (start, 1), (task_id, untouched.log)
        assert len(solved.details["tests"]) >= 10
    print(
        f"evaluator: {len(timings)} evaluations, {sum(timings) / len(timings):.2f} s mean, "
        f"{max(timings):.2f} s max (3 at a time)"
    )
