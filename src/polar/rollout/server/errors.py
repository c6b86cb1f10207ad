"""What the rollout server refuses, as its domain says it (:mod:`polar.rollout.server.service`).

The domain speaks no HTTP: it raises one of these, its message one line for
people, and the server's API (:mod:`polar.rollout.server.app`) answers each
with its status and the shared error body, in one table.
"""

from __future__ import annotations


class RolloutServerError(Exception):
    """A request the rollout server will not act on; the message says why."""


class TaskNotFound(RolloutServerError):
    def __init__(self, task_id: str) -> None:
        super().__init__(f"no task {task_id}")


class TaskExists(RolloutServerError):
    """A submission chose a task id that is taken."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"task {task_id} already exists")


class InvalidSubmission(RolloutServerError):
    """A submission that could not run: its harness (unknown, or options it refuses)
    or a host path it names that cannot be packed; the message names the field."""


class NodeUnknown(RolloutServerError):
    """A node that never registered, or was declared lost since."""

    def __init__(self, node_id: str) -> None:
        super().__init__(f"node {node_id} is not registered")


class SessionUnknown(RolloutServerError):
    """A result for a session the server does not know (or of another task)."""

    def __init__(self, session_id: str, task_id: str) -> None:
        super().__init__(f"no session {session_id} of task {task_id}")


class InvalidResult(RolloutServerError):
    """A result whose status is not a final one."""
