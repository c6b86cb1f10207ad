"""SWE-bench style instances as tasks.

An instance names a repository at a commit, a problem statement, a
``test_patch`` adding the tests that check the fix, and two test lists:
``FAIL_TO_PASS`` (fail before the fix, pass after) and ``PASS_TO_PASS`` (must
keep passing). The lists come as JSON lists or, as in the Hugging Face
datasets, as JSON text. The workspace is either the repository checked out at
``base_commit`` (``repo_url`` is a template over ``{repo}`` and ``{repo_dir}``,
e.g. ``file:///mirrors/{repo_dir}``) or an image (a row's ``image_name``, or
the ``image`` template over ``{instance_id}`` and ``{docker_id}``, SWE-bench's
image naming), whose checkout lives at ``/testbed``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, overload

import pydantic
from pydantic import BaseModel, ConfigDict, Field, field_validator

from polar.runtime.base import RuntimeSpec
from polar.tasks.errors import TaskLoadError
from polar.tasks.model import EvaluatorSpec, GitWorkspace, ImageWorkspace, Task, Workspace
from polar.tasks.parse import check_unique, describe, local_repo
from polar.tasks.sources import read_rows

DEFAULT_REPO_URL = "https://github.com/{repo}.git"
IMAGE_WORKDIR = "/testbed"


class SwebenchInstance(BaseModel):
    """The fields Polar reads from an instance (others are ignored)."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    instance_id: str = Field(min_length=1)
    repo: str = Field(min_length=1)
    base_commit: str = Field(min_length=1)
    problem_statement: str = Field(min_length=1)
    test_patch: str
    fail_to_pass: tuple[str, ...] = Field(alias="FAIL_TO_PASS", min_length=1)
    pass_to_pass: tuple[str, ...] = Field(default=(), alias="PASS_TO_PASS")
    version: str | None = None
    environment_setup_commit: str | None = None
    created_at: str | None = None
    image_name: str | None = None

    @field_validator("fail_to_pass", "pass_to_pass", mode="before")
    @classmethod
    def _json_text(cls, value: object) -> object:
        if isinstance(value, str):
            try:
                return json.loads(value)
            except json.JSONDecodeError:
                raise ValueError("not a list of test ids (nor JSON text of one)") from None
        return value

    @field_validator("version", "created_at", mode="before")
    @classmethod
    def _text(cls, value: object) -> object:
        return value if value is None or isinstance(value, str) else str(value)


def is_swebench_row(data: Mapping[str, Any]) -> bool:
    return "instance_id" in data and "FAIL_TO_PASS" in data


@overload
def load_swebench(
    source: Mapping[str, Any],
    *,
    repo_url: str = ...,
    image: str | None = ...,
    setup: Sequence[str] = ...,
    where: str = ...,
) -> Task: ...


@overload
def load_swebench(
    source: str | Path,
    *,
    repo_url: str = ...,
    image: str | None = ...,
    setup: Sequence[str] = ...,
    where: str = ...,
) -> list[Task]: ...


def load_swebench(
    source: Mapping[str, Any] | str | Path,
    *,
    repo_url: str = DEFAULT_REPO_URL,
    image: str | None = None,
    setup: Sequence[str] = (),
    where: str = "instance",
) -> Task | list[Task]:
    """One instance (a mapping) as a task, or every instance of a file.

    ``setup`` commands run in the workspace before the agent (e.g. installing
    the package); ``where`` labels a single mapping in error messages.
    """
    if isinstance(source, Mapping):
        return swebench_task(source, where=where, repo_url=repo_url, image=image, setup=setup)
    path = Path(source)
    if not path.is_file():
        raise TaskLoadError(f"{path}: no such file")
    rows = read_rows(path)
    located = [
        (
            row.where,
            swebench_task(
                row.data,
                where=row.where,
                repo_url=repo_url,
                image=image,
                setup=setup,
                base_dir=path.parent,
            ),
        )
        for row in rows
    ]
    check_unique(located)
    return [task for _, task in located]


def swebench_task(
    data: Mapping[str, Any],
    *,
    where: str,
    repo_url: str = DEFAULT_REPO_URL,
    image: str | None = None,
    setup: Sequence[str] = (),
    base_dir: Path | None = None,
) -> Task:
    """One instance row as a task; a relative local ``repo_url`` is resolved
    against ``base_dir`` (default: the working directory)."""
    instance_id = data.get("instance_id")
    label = f"{where} (instance {instance_id!r})" if isinstance(instance_id, str) else where
    try:
        instance = SwebenchInstance.model_validate(data)
    except pydantic.ValidationError as exc:
        raise TaskLoadError(f"{label}: {describe(exc)}") from None

    docker_id = instance.instance_id.replace("__", "_1776_").lower()
    image_name = instance.image_name or (
        image.format(instance_id=instance.instance_id, docker_id=docker_id) if image else None
    )
    workspace: Workspace
    runtime: RuntimeSpec | None = None
    if image_name:
        workspace = ImageWorkspace(image=image_name, path=IMAGE_WORKDIR)
        runtime = RuntimeSpec(image=image_name, workdir=IMAGE_WORKDIR)
    else:
        url = repo_url.format(repo=instance.repo, repo_dir=instance.repo.replace("/", "__"))
        local = local_repo(url, base_dir or Path.cwd())
        if local is not None:
            if not local.exists():
                raise TaskLoadError(f"{label}: repo: no such repository {local}")
            if "://" not in url:
                url = str(local)
        workspace = GitWorkspace(repo=url, commit=instance.base_commit)

    metadata = {
        "source": "swebench",
        "repo": instance.repo,
        "base_commit": instance.base_commit,
    } | {
        key: value
        for key, value in (
            ("version", instance.version),
            ("environment_setup_commit", instance.environment_setup_commit),
            ("created_at", instance.created_at),
        )
        if value is not None
    }
    try:
        return Task(
            id=instance.instance_id,
            instruction=instance.problem_statement,
            workspace=workspace,
            setup=tuple(setup),
            evaluator=EvaluatorSpec(
                kind="swebench",
                config={
                    "fail_to_pass": list(instance.fail_to_pass),
                    "pass_to_pass": list(instance.pass_to_pass),
                    "test_patch": instance.test_patch,
                },
                fresh_runtime=True,
            ),
            runtime=runtime,
            metadata=metadata,
        )
    except pydantic.ValidationError as exc:
        raise TaskLoadError(f"{label}: {describe(exc)}") from None
