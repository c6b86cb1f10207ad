"""The built-in task suite: small, self-contained Python coding tasks.

Each task lives in its own directory here: ``task.yaml`` (a task row with paths
relative to it), ``repo/`` (the tiny project the agent works on),
``hidden_tests/`` (pytest files the agent never sees, copied into the
workspace by the evaluator), and, for tests and scripted agents,
``solution.patch`` (a correct fix) and ``wrong.patch`` (a plausible wrong one).
Every task's hidden tests fail on the untouched repository, pass with the
solution and fail with the wrong patch; they run in well under two seconds
without network. Their evaluator (``pytest``) puts the workspace's test runner
files back as the baseline had them and starts the real pytest
(:mod:`polar.reward.hardening`), so an agent cannot score by planting a fake
test runner or a hook that turns failures into passes.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from polar.tasks.errors import TaskLoadError
from polar.tasks.model import Task
from polar.tasks.parse import parse_task

BUILTIN_DIR = Path(__file__).parent
SUITE_NAME = "builtin"
"""``load_tasks("builtin")`` loads the suite."""


def builtin_task_dirs() -> list[Path]:
    return sorted(path.parent for path in BUILTIN_DIR.glob("*/task.yaml"))


def builtin_tasks() -> list[Task]:
    """Every built-in task, sorted by id."""
    return [_load(path) for path in builtin_task_dirs()]


def builtin_task(task_id: str) -> Task:
    return _load(_dir(task_id))


def solution_patch(task_id: str) -> str:
    """A unified diff (``patch -p1``) that solves the task."""
    return (_dir(task_id) / "solution.patch").read_text(encoding="utf-8")


def wrong_patch(task_id: str) -> str:
    """A unified diff that looks like a fix but fails the hidden tests."""
    return (_dir(task_id) / "wrong.patch").read_text(encoding="utf-8")


def _dir(task_id: str) -> Path:
    path = BUILTIN_DIR / task_id
    if not (path / "task.yaml").is_file():
        known = [p.name for p in builtin_task_dirs()]
        raise TaskLoadError(f"no built-in task {task_id!r}; there are {known}")
    return path


def _load(task_dir: Path) -> Task:
    path = task_dir / "task.yaml"
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise TaskLoadError(f"{path}: a task must be a mapping")
    return parse_task(data, base_dir=task_dir, where=str(path))
