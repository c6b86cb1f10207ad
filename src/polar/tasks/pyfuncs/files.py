"""A generated task's files: its workspace, its hidden tests, and the :class:`Task` row.

The workspace holds ``examples.py`` (the visible examples: ``python
examples.py`` exits 0 when they all pass and otherwise prints, in a line each,
what failed) and, for a ``fix`` task, the wrong ``solution.py``. The hidden
tests are ``test_hidden.py``: one pytest case per hidden case, each importing
the function itself, so a missing function or a ``solution.py`` that does not
import fails every case instead of collecting nothing.

Tasks need their files on disk (the node copies a directory workspace and the
evaluator copies the hidden tests). :func:`write_family` writes the whole
family once into a directory named after its content's digest, atomically, so
that loading it again (or from another process at the same time) reuses it
and a change of the generator never reuses stale files.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from polar.tasks.errors import TaskLoadError
from polar.tasks.model import DirectoryWorkspace, EvaluatorSpec, Task
from polar.tasks.pyfuncs.family import FILE, FuncTask, Kind

WORKSPACE = "workspace"
HIDDEN_TESTS = "hidden_tests"
EXAMPLES = "examples.py"
CHECK = f"python {EXAMPLES}"
"""The command that runs a task's visible examples in its workspace."""
EVALUATOR = EvaluatorSpec(
    kind="pytest", config={"reward": "fraction", "timeout_s": 30}, timeout_s=120
)
"""The fraction of hidden cases passed is the reward (one test per case), so GRPO
sees a partly right function beside a wrong one; the task is solved
(``resolved``, pass@1) only when every case passes."""

_EXAMPLES = '''\
"""The visible examples of this task: `python examples.py` exits 0 when they all pass."""

import copy
import os
import sys

FUNCTION = {function!r}
EXAMPLES = [
{examples}
]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    if not os.path.exists(os.path.join(here, "solution.py")):
        print("solution.py does not exist")
        return 1
    try:
        import solution
    except BaseException as exc:
        print(f"solution.py fails when imported: {{type(exc).__name__}}: {{exc}}")
        return 1
    function = getattr(solution, FUNCTION, None)
    if not callable(function):
        defined = sorted(
            name for name, value in vars(solution).items()
            if callable(value) and not name.startswith("_")
        )
        print(f"solution.py has no function {{FUNCTION}}"
              + (f" (it defines {{', '.join(defined)}})" if defined else ""))
        return 1
    failed = 0
    for call, args, expected in EXAMPLES:
        try:
            got = function(*copy.deepcopy(args))
        except BaseException as exc:
            print(f"{{call}} raised {{type(exc).__name__}}: {{exc}}")
            failed += 1
            continue
        if got != expected:
            print(f"{{call}} returned {{got!r}}, expected {{expected!r}}")
            failed += 1
    if failed:
        return 1
    print(f"All {{len(EXAMPLES)}} examples pass.")
    return 0


sys.exit(main())
'''

_HIDDEN = '''\
"""Hidden tests of {task_id}: copied into the workspace only after the agent finished."""

import copy

import pytest

CASES = [
{cases}
]


@pytest.mark.parametrize(("args", "expected"), CASES)
def test_{function}(args, expected):
    from solution import {function}

    assert {function}(*copy.deepcopy(args)) == expected
'''


def task_files(task: FuncTask) -> dict[str, str]:
    """The task's files, by path relative to its directory."""
    examples = "\n".join(
        f"    ({case.call(task.function)!r}, {case.args!r}, {case.expected!r}),"
        for case in task.visible
    )
    cases = "\n".join(f"    ({case.args!r}, {case.expected!r})," for case in task.hidden)
    files = {
        f"{WORKSPACE}/{EXAMPLES}": _EXAMPLES.format(function=task.function, examples=examples),
        f"{HIDDEN_TESTS}/test_hidden.py": _HIDDEN.format(
            task_id=task.id, function=task.function, cases=cases
        ),
    }
    if task.kind is Kind.FIX:
        files[f"{WORKSPACE}/{FILE}"] = task.wrong
    return files


def directory_name(task: FuncTask) -> str:
    return task.id.replace("/", ".")


def as_task(task: FuncTask, directory: Path) -> Task:
    """The :class:`Task` of a generated task whose files are in ``directory``."""
    return Task(
        id=task.id,
        instruction=task.instruction,
        workspace=DirectoryWorkspace(path=directory / WORKSPACE),
        hidden_tests=directory / HIDDEN_TESTS,
        evaluator=EVALUATOR,
        metadata={
            "suite": "pyfuncs",
            "split": task.split.value,
            "template": task.template,
            "params": dict(task.params),
            "kind": task.kind.value,
            "function": task.function,
            "heldout_by": task.heldout_by,
        },
    )


def write_family(tasks: list[FuncTask], root: Path, label: str) -> Path:
    """Every task's files under ``root/<label>-<digest>/<task dir>/``, written once;
    returns that directory."""
    files = {
        f"{directory_name(task)}/{path}": text
        for task in tasks
        for path, text in task_files(task).items()
    }
    digest = hashlib.sha256(json.dumps(sorted(files.items())).encode()).hexdigest()[:16]
    target = root.resolve() / f"{label}-{digest}"
    if target.is_dir():
        return target
    try:
        root.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{label}-", dir=root))
    except OSError as exc:
        raise TaskLoadError(f"{label}: cannot write its tasks under {root}: {exc}") from None
    try:
        _write_tree(scratch, files)
        os.rename(scratch, target)
    except OSError as exc:
        if not target.is_dir():  # another process won the race: use its copy
            raise TaskLoadError(f"{label}: cannot write its tasks to {target}: {exc}") from None
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(scratch)
    return target


def _write_tree(root: Path, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    for directory in (root, *(path for path in root.rglob("*") if path.is_dir())):
        directory.chmod(0o755)
