"""One task row -> a :class:`Task` with absolute, existing paths.

Relative paths (a directory workspace, a local git repository, hidden tests)
are resolved against the directory of the file the row came from, and must
exist; a ``Task`` never holds a relative path. Errors name the row and the
field in one line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, assert_never
from urllib.parse import unquote, urlparse

import pydantic

from polar.tasks.errors import TaskLoadError
from polar.tasks.model import DirectoryWorkspace, GitWorkspace, ImageWorkspace, Task

_SCP_LIKE = re.compile(r"^[\w.-]+@[\w.-]+:")


def parse_task(data: Mapping[str, Any], *, base_dir: Path, where: str) -> Task:
    """Validate one row and resolve its paths against ``base_dir``."""
    label = _label(where, data.get("id"))
    try:
        task = Task.model_validate(data)
    except pydantic.ValidationError as exc:
        raise TaskLoadError(f"{label}: {describe(exc)}") from None
    return resolve_paths(task, base_dir=base_dir, where=label)


def describe(exc: pydantic.ValidationError) -> str:
    """The first problem of a validation error as ``field: message``."""
    errors = exc.errors()
    first = errors[0]
    field = _field(first["loc"])
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{field}: {first['msg']}{more}"


def _field(loc: tuple[int | str, ...]) -> str:
    # A discriminated union adds its tag to the location
    # ("workspace.directory.path"); people wrote "workspace.path".
    parts = [
        str(part)
        for index, part in enumerate(loc)
        if not (index > 0 and loc[index - 1] == "workspace" and part in _WORKSPACE_KINDS)
    ]
    return ".".join(parts) or "task"


_WORKSPACE_KINDS = frozenset({"directory", "git", "image"})


def _label(where: str, task_id: object) -> str:
    return f"{where} (task {task_id!r})" if isinstance(task_id, str) else where


def resolve_paths(task: Task, *, base_dir: Path, where: str) -> Task:
    """``task`` with every local path absolute; raises if one does not exist."""
    workspace = task.workspace
    match workspace:
        case DirectoryWorkspace():
            path = _absolute(workspace.path, base_dir)
            if not path.is_dir():
                raise TaskLoadError(f"{where}: workspace.path: no such directory {path}")
            workspace = workspace.model_copy(update={"path": path})
        case GitWorkspace():
            local = local_repo(workspace.repo, base_dir)
            if local is not None:
                if not local.exists():
                    raise TaskLoadError(f"{where}: workspace.repo: no such repository {local}")
                if "://" not in workspace.repo:
                    workspace = workspace.model_copy(update={"repo": str(local)})
        case ImageWorkspace():
            pass
        case _:
            assert_never(workspace)
    hidden = task.hidden_tests
    if hidden is not None:
        hidden = _absolute(hidden, base_dir)
        if not hidden.is_dir():
            raise TaskLoadError(f"{where}: hidden_tests: no such directory {hidden}")
    return task.model_copy(update={"workspace": workspace, "hidden_tests": hidden})


def local_repo(repo: str, base_dir: Path) -> Path | None:
    """The local path a git ``repo`` names (a path or ``file://`` URL), else None."""
    if "://" in repo:
        url = urlparse(repo)
        return Path(unquote(url.path)) if url.scheme == "file" else None
    if _SCP_LIKE.match(repo):
        return None
    return _absolute(Path(repo).expanduser(), base_dir)


def _absolute(path: Path, base_dir: Path) -> Path:
    return path if path.is_absolute() else (base_dir / path).resolve()


def check_unique(tasks: Iterable[tuple[str, Task]]) -> None:
    """Raise for the first task id seen twice, naming both places."""
    seen: dict[str, str] = {}
    for where, task in tasks:
        if task.id in seen:
            raise TaskLoadError(
                f"{where}: duplicate task id {task.id!r} (first at {seen[task.id]})"
            )
        seen[task.id] = where
