"""The task layer's errors: one tree, each message one line a person can act on."""

from __future__ import annotations


class TaskError(Exception):
    """Base of every error the task layer raises on purpose."""


class TaskLoadError(TaskError):
    """A task file, row or directory that cannot become a :class:`~polar.tasks.model.Task`.

    The message names the file, the row or line, and the field.
    """


class WorkspaceError(TaskError):
    """A task's workspace could not be copied or checked out."""


class SetupError(TaskError):
    """A set-up command failed, or the workspace baseline could not be recorded."""
