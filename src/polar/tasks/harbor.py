"""Harbor / Terminal-Bench task directories.

A task directory holds ``instruction.md``, ``tests/test.sh`` (the verifier,
which writes ``/logs/verifier/reward.txt`` or ``reward.json``), an optional
``task.toml`` (``[metadata]``, ``[verifier] timeout_sec``, ``[agent]
timeout_sec``, ``[environment] docker_image / cpus / memory / memory_mb``) and
usually ``environment/`` (the image's build context). Polar does not build
images: with a ``docker_image`` the workspace is that image's ``/app``;
without one, ``environment/`` itself is copied as the workspace.

The ``tests/`` directory becomes the task's hidden tests; the runtime binds
``/tests`` and ``/logs`` so the verifier finds the paths it expects.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from polar.runtime.base import RuntimeSpec
from polar.tasks.errors import TaskLoadError
from polar.tasks.model import (
    TASK_ID_PATTERN,
    DirectoryWorkspace,
    EvaluatorSpec,
    ImageWorkspace,
    Task,
    Workspace,
)
from polar.tasks.parse import describe

TESTS_PATH = "/tests"
LOGS_PATH = "/logs"
IMAGE_WORKDIR = "/app"
"""Where Terminal-Bench images keep the task's files."""
DEFAULT_VERIFIER_TIMEOUT_S = 120.0
EVALUATOR_MARGIN_S = 60.0
"""Evaluator budget beyond the verifier's own timeout (copying tests, reading rewards)."""


class _Table(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class _Timeout(_Table):
    timeout_sec: float | None = Field(default=None, gt=0)


class _Environment(_Table):
    docker_image: str | None = None
    cpus: float | None = Field(default=None, gt=0)
    memory_mb: int | None = Field(default=None, gt=0)
    memory: str | None = Field(default=None, pattern=r"^\s*\d+(\.\d+)?\s*[KkMmGg]?[Bb]?\s*$")


class _TaskToml(_Table):
    metadata: dict[str, Any] = Field(default_factory=dict)
    verifier: _Timeout = _Timeout()
    agent: _Timeout = _Timeout()
    environment: _Environment = _Environment()


def is_harbor_task(path: Path) -> bool:
    return (path / "instruction.md").is_file()


def load_harbor(task_dir: str | Path, *, image: str | None = None) -> Task:
    """The task in a Harbor task directory; ``image`` overrides ``docker_image``."""
    root = Path(task_dir).resolve()
    if not root.is_dir():
        raise TaskLoadError(f"{root}: no such task directory")
    task_id = root.name
    if not re.match(TASK_ID_PATTERN, task_id):
        raise TaskLoadError(f"{root}: directory name {task_id!r} is not a valid task id")
    instruction = _read(root / "instruction.md").strip()
    if not instruction:
        raise TaskLoadError(f"{root / 'instruction.md'}: empty instruction")
    tests = root / "tests"
    if not (tests / "test.sh").is_file():
        raise TaskLoadError(f"{root}: tests/test.sh: missing")
    toml = _task_toml(root / "task.toml")

    image = image or toml.environment.docker_image
    workspace: Workspace
    runtime: dict[str, Any] = {"binds": (TESTS_PATH, LOGS_PATH)}
    if image:
        workspace = ImageWorkspace(image=image, path=IMAGE_WORKDIR)
        runtime |= {"image": image, "workdir": IMAGE_WORKDIR}
    elif (root / "environment").is_dir():
        workspace = DirectoryWorkspace(path=root / "environment")
    else:
        raise TaskLoadError(
            f"{root}: no environment.docker_image in task.toml and no environment/ directory"
        )
    if toml.environment.cpus is not None:
        runtime["cpus"] = toml.environment.cpus
    memory_mb = toml.environment.memory_mb or _megabytes(toml.environment.memory)
    if memory_mb is not None:
        runtime["memory_mb"] = memory_mb

    verifier_timeout = toml.verifier.timeout_sec or DEFAULT_VERIFIER_TIMEOUT_S
    metadata: dict[str, Any] = {"source": "harbor", "task_dir": str(root)}
    metadata |= json.loads(json.dumps(toml.metadata, default=str))
    if toml.agent.timeout_sec is not None:
        metadata["agent_timeout_s"] = toml.agent.timeout_sec
    return Task(
        id=task_id,
        instruction=instruction,
        workspace=workspace,
        evaluator=EvaluatorSpec(
            kind="harbor",
            config={"verifier_timeout_s": verifier_timeout},
            timeout_s=verifier_timeout + EVALUATOR_MARGIN_S,
        ),
        hidden_tests=tests,
        runtime=RuntimeSpec(**runtime),
        metadata=metadata,
    )


def load_harbor_tasks(root: Path) -> list[Task]:
    """Every task directory directly under ``root`` (sorted by name)."""
    dirs = sorted(path for path in root.iterdir() if path.is_dir() and is_harbor_task(path))
    if not dirs:
        raise TaskLoadError(f"{root}: not a Harbor task directory and holds none")
    return [load_harbor(path) for path in dirs]


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TaskLoadError(f"{path}: missing") from None
    except UnicodeDecodeError:
        raise TaskLoadError(f"{path}: not UTF-8 text") from None
    except OSError as exc:
        raise TaskLoadError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _task_toml(path: Path) -> _TaskToml:
    if not path.exists():
        return _TaskToml()
    try:
        data = tomllib.loads(_read(path))
    except tomllib.TOMLDecodeError as exc:
        raise TaskLoadError(f"{path}: not valid TOML ({exc})") from None
    try:
        return _TaskToml.model_validate(data)
    except pydantic.ValidationError as exc:
        raise TaskLoadError(f"{path}: {describe(exc)}") from None


_UNITS = {"": 1 / (1024 * 1024), "k": 1 / 1024, "m": 1.0, "g": 1024.0}


def _megabytes(memory: str | None) -> int | None:
    """``"2G"`` -> 2048; a bare number is bytes (Docker's convention)."""
    if memory is None:
        return None
    match = re.match(r"^\s*(\d+(?:\.\d+)?)\s*([KkMmGg]?)[Bb]?\s*$", memory)
    assert match is not None  # the model's pattern checked it
    return max(1, round(float(match[1]) * _UNITS[match[2].lower()]))
