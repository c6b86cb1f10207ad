"""Harbor / Terminal-Bench task directories load as tasks."""

from __future__ import annotations

from pathlib import Path

import pytest

from polar.tasks import DirectoryWorkspace, ImageWorkspace, TaskLoadError, load_harbor, load_tasks

TASK_TOML = """\
version = "1.0"

[metadata]
author_name = "Ada"
difficulty = "medium"
tags = ["files", "bash"]

[verifier]
timeout_sec = 300.0

[agent]
timeout_sec = 900.0

[environment]
build_timeout_sec = 600.0
docker_image = "example/hello-task:1"
cpus = 2
memory = "4G"
storage = "10G"
"""


def make_task(root: Path, name: str = "hello-file", toml: str | None = TASK_TOML) -> Path:
    task = root / name
    (task / "tests").mkdir(parents=True)
    (task / "environment").mkdir()
    (task / "environment" / "Dockerfile").write_text("FROM python:3.11\nWORKDIR /app\n")
    (task / "instruction.md").write_text("Write hello to /app/hello.txt.\n")
    (task / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    if toml is not None:
        (task / "task.toml").write_text(toml)
    return task


def test_a_task_directory_with_an_image(tmp_path: Path) -> None:
    task = load_harbor(make_task(tmp_path))

    assert task.id == "hello-file"
    assert task.instruction == "Write hello to /app/hello.txt."
    assert task.workspace == ImageWorkspace(image="example/hello-task:1", path="/app")
    assert task.hidden_tests == tmp_path / "hello-file" / "tests"
    assert task.evaluator.kind == "harbor"
    assert task.evaluator.config == {"verifier_timeout_s": 300.0}
    assert task.evaluator.timeout_s == 360.0
    assert task.runtime is not None
    assert task.runtime.binds == ("/tests", "/logs")
    assert task.runtime.image == "example/hello-task:1"
    assert task.runtime.workdir == "/app"
    assert task.runtime.cpus == 2
    assert task.runtime.memory_mb == 4096
    assert task.metadata["difficulty"] == "medium"
    assert task.metadata["tags"] == ["files", "bash"]
    assert task.metadata["agent_timeout_s"] == 900.0


def test_without_an_image_the_environment_directory_is_the_workspace(tmp_path: Path) -> None:
    task = load_harbor(make_task(tmp_path, toml=None))

    assert task.workspace == DirectoryWorkspace(path=tmp_path / "hello-file" / "environment")
    assert task.evaluator.config == {"verifier_timeout_s": 120.0}
    assert task.runtime is not None
    assert task.runtime.model_fields_set == {"binds"}


def test_an_explicit_image_wins(tmp_path: Path) -> None:
    task = load_harbor(make_task(tmp_path), image="mirror/hello:1")

    assert task.workspace == ImageWorkspace(image="mirror/hello:1", path="/app")


def test_load_tasks_on_one_task_and_on_a_directory_of_tasks(tmp_path: Path) -> None:
    make_task(tmp_path, "b-task")
    make_task(tmp_path, "a-task", toml=None)
    (tmp_path / "notes").mkdir()

    assert [t.id for t in load_tasks(tmp_path)] == ["a-task", "b-task"]
    assert [t.id for t in load_tasks(tmp_path / "b-task")] == ["b-task"]


def test_missing_instruction(tmp_path: Path) -> None:
    task = make_task(tmp_path)
    (task / "instruction.md").unlink()

    with pytest.raises(TaskLoadError, match=r"instruction.md: missing"):
        load_harbor(task)


def test_empty_instruction(tmp_path: Path) -> None:
    task = make_task(tmp_path)
    (task / "instruction.md").write_text("\n\n")

    with pytest.raises(TaskLoadError, match="empty instruction"):
        load_harbor(task)


def test_missing_test_script(tmp_path: Path) -> None:
    task = make_task(tmp_path)
    (task / "tests" / "test.sh").unlink()

    with pytest.raises(TaskLoadError, match=r"hello-file: tests/test.sh: missing"):
        load_harbor(task)


def test_no_image_and_no_environment(tmp_path: Path) -> None:
    task = make_task(tmp_path, toml=None)
    (task / "environment" / "Dockerfile").unlink()
    (task / "environment").rmdir()

    with pytest.raises(TaskLoadError, match=r"no environment\.docker_image"):
        load_harbor(task)


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        ("[verifier\n", "task.toml: not valid TOML"),
        (
            "[verifier]\ntimeout_sec = -5\n",
            "task.toml: verifier.timeout_sec: Input should be greater than 0",
        ),
        ('[environment]\nmemory = "lots"\n', "task.toml: environment.memory: String should match"),
        (
            '[environment]\ncpus = "two"\n',
            "task.toml: environment.cpus: Input should be a valid number",
        ),
    ],
)
def test_a_bad_task_toml_names_the_field(tmp_path: Path, toml: str, expected: str) -> None:
    with pytest.raises(TaskLoadError) as info:
        load_harbor(make_task(tmp_path, toml=toml))

    assert expected in str(info.value)


def test_a_directory_name_that_is_not_a_task_id(tmp_path: Path) -> None:
    with pytest.raises(TaskLoadError, match="is not a valid task id"):
        load_harbor(make_task(tmp_path, name="bad name"))


def test_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(TaskLoadError, match="no such task directory"):
        load_harbor(tmp_path / "absent")
