"""What a task is: an instruction, a workspace, set-up commands and how to score it.

One task submitted with ``num_samples = n`` is one GRPO group: n sessions of
the same task, each in its own runtime. Loaders (:mod:`polar.tasks.load`) turn
JSONL / YAML / Parquet rows, SWE-bench instances and Harbor task directories
into :class:`Task`; relative paths in a file are resolved against the file's
directory when it is loaded, so a ``Task`` holds absolute paths only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from polar.runtime.base import RuntimeSpec

TASK_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}$"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DirectoryWorkspace(_Model):
    """A host directory copied into the session's workspace."""

    kind: Literal["directory"] = "directory"
    path: Path


class GitWorkspace(_Model):
    """A git repository (a local path or ``file://`` URL here) checked out at a commit."""

    kind: Literal["git"] = "git"
    repo: str
    commit: str


class ImageWorkspace(_Model):
    """The workspace is already inside the runtime's image, at ``path``."""

    kind: Literal["image"] = "image"
    image: str
    path: str


Workspace = Annotated[
    DirectoryWorkspace | GitWorkspace | ImageWorkspace, Field(discriminator="kind")
]


class EvaluatorSpec(_Model):
    """Which evaluator scores the session, and its settings."""

    kind: str
    """``command``, ``pytest``, ``swebench``, ``harbor``, or ``package.module:factory``."""
    config: dict[str, Any] = Field(default_factory=dict)
    timeout_s: float = Field(default=600.0, gt=0)
    fresh_runtime: bool = False
    """Score in a fresh copy of the task's workspace (the agent's diff applied)
    instead of the runtime the agent used."""


class Task(_Model):
    id: str = Field(pattern=TASK_ID_PATTERN)
    instruction: str = Field(min_length=1)
    workspace: Workspace
    setup: tuple[str, ...] = ()
    """Shell commands run in the workspace, in order, before the agent starts."""
    evaluator: EvaluatorSpec
    hidden_tests: Path | None = None
    """A host directory the evaluator copies into the workspace only after the
    agent finished (the agent never sees it)."""
    runtime: RuntimeSpec | None = None
    """Settings this task needs from its runtime (an image, limits); merged over
    the node's defaults."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    files: dict[str, str] = Field(default_factory=dict)
    """Host path -> SHA-256 of its archive, for each path above; set by the rollout
    server when the task is submitted (:mod:`polar.rollout.files`), so that nodes
    sharing no path with it fetch what they need. What a submitter puts here is
    replaced."""
