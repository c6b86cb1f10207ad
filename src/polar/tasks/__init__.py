"""Tasks: what an agent is asked to do, in which workspace, and how it is scored.

:mod:`polar.tasks.model` defines :class:`Task`; :mod:`polar.tasks.load` reads
task files, SWE-bench instances and Harbor task directories;
:mod:`polar.tasks.workspace` prepares a session's workspace;
:mod:`polar.tasks.builtin` is a small suite of self-contained coding tasks;
:mod:`polar.tasks.pyfuncs` generates one-function tasks for small models.
"""

from polar.tasks.builtin import builtin_task, builtin_tasks, solution_patch, wrong_patch
from polar.tasks.errors import SetupError, TaskError, TaskLoadError, WorkspaceError
from polar.tasks.load import load_harbor, load_swebench, load_tasks
from polar.tasks.model import (
    DirectoryWorkspace,
    EvaluatorSpec,
    GitWorkspace,
    ImageWorkspace,
    Task,
    Workspace,
)
from polar.tasks.parse import parse_task
from polar.tasks.workspace import materialize, run_setup, runtime_spec_for, workspace_path

__all__ = [
    "DirectoryWorkspace",
    "EvaluatorSpec",
    "GitWorkspace",
    "ImageWorkspace",
    "SetupError",
    "Task",
    "TaskError",
    "TaskLoadError",
    "Workspace",
    "WorkspaceError",
    "builtin_task",
    "builtin_tasks",
    "load_harbor",
    "load_swebench",
    "load_tasks",
    "materialize",
    "parse_task",
    "run_setup",
    "runtime_spec_for",
    "solution_patch",
    "workspace_path",
    "wrong_patch",
]
