"""load_tasks on real JSONL / JSON / YAML / Parquet files, and every kind of bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow
import pyarrow.parquet
import pytest
import yaml

from polar.tasks import (
    DirectoryWorkspace,
    GitWorkspace,
    ImageWorkspace,
    TaskLoadError,
    builtin_tasks,
    load_tasks,
)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A directory with a workspace and hidden tests, for relative paths to name."""
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "main.py").write_text("print('hi')\n")
    (tmp_path / "hidden").mkdir()
    (tmp_path / "hidden" / "test_main.py").write_text("def test_ok():\n    pass\n")
    return tmp_path


def row(task_id: str = "t1", **fields: Any) -> dict[str, Any]:
    return {
        "id": task_id,
        "instruction": "Make it print hello.",
        "workspace": {"kind": "directory", "path": "repo"},
        "hidden_tests": "hidden",
        "evaluator": {"kind": "pytest", "config": {"reward": "fraction"}},
        **fields,
    }


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_rows_load_with_paths_resolved_against_the_file(project: Path) -> None:
    path = write_jsonl(
        project / "tasks.jsonl",
        [row("a", setup=["pip --version"]), row("b", metadata={"difficulty": "easy"})],
    )

    tasks = load_tasks(path)

    assert [t.id for t in tasks] == ["a", "b"]
    assert tasks[0].workspace == DirectoryWorkspace(path=project / "repo")
    assert tasks[0].hidden_tests == project / "hidden"
    assert tasks[0].setup == ("pip --version",)
    assert tasks[0].evaluator.kind == "pytest"
    assert tasks[0].evaluator.config == {"reward": "fraction"}
    assert tasks[1].metadata == {"difficulty": "easy"}


def test_jsonl_loads_the_same_from_another_working_directory(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_jsonl(project / "tasks.jsonl", [row()])
    monkeypatch.chdir(project / "hidden")

    (task,) = load_tasks("../tasks.jsonl")

    assert task.workspace == DirectoryWorkspace(path=project / "repo")
    assert path.exists()


def test_yaml_as_a_list_and_as_a_tasks_mapping(project: Path) -> None:
    (project / "list.yaml").write_text(yaml.safe_dump([row("a"), row("b")]))
    (project / "mapping.yml").write_text(yaml.safe_dump({"tasks": [row("c")]}))

    assert [t.id for t in load_tasks(project / "list.yaml")] == ["a", "b"]
    assert [t.id for t in load_tasks(project / "mapping.yml")] == ["c"]


def test_json_document(project: Path) -> None:
    (project / "tasks.json").write_text(json.dumps({"tasks": [row("a")]}))

    assert [t.id for t in load_tasks(project / "tasks.json")] == ["a"]


def test_parquet_with_struct_and_json_text_columns(project: Path) -> None:
    rows = [row("a"), row("b")]
    structs = pyarrow.Table.from_pylist(
        [{**r, "evaluator": {"kind": "command", "timeout_s": 30.0}} for r in rows]
    )
    pyarrow.parquet.write_table(structs, project / "structs.parquet")
    texts = pyarrow.Table.from_pylist(
        [
            {
                "id": r["id"],
                "instruction": r["instruction"],
                "workspace": json.dumps(r["workspace"]),
                "evaluator": json.dumps({"kind": "pytest", "config": {"required": ["x"]}}),
            }
            for r in rows
        ]
    )
    pyarrow.parquet.write_table(texts, project / "texts.parquet")

    from_structs = load_tasks(project / "structs.parquet")
    from_texts = load_tasks(project / "texts.parquet")

    assert [t.id for t in from_structs] == ["a", "b"]
    assert from_structs[0].evaluator.kind == "command"
    assert from_structs[0].evaluator.timeout_s == 30.0
    assert from_structs[0].hidden_tests == project / "hidden"
    assert from_texts[1].evaluator.config == {"required": ["x"]}
    assert from_texts[1].workspace == DirectoryWorkspace(path=project / "repo")


def test_git_and_image_workspaces(project: Path) -> None:
    (project / "mirror.git").mkdir()
    path = write_jsonl(
        project / "tasks.jsonl",
        [
            row("local", workspace={"kind": "git", "repo": "mirror.git", "commit": "abc123"}),
            row(
                "url", workspace={"kind": "git", "repo": "https://example.org/r.git", "commit": "c"}
            ),
            row("image", workspace={"kind": "image", "image": "python:3.11", "path": "/app"}),
        ],
    )

    local, url, image = load_tasks(path)

    assert local.workspace == GitWorkspace(repo=str(project / "mirror.git"), commit="abc123")
    assert url.workspace == GitWorkspace(repo="https://example.org/r.git", commit="c")
    assert image.workspace == ImageWorkspace(image="python:3.11", path="/app")


def test_builtin_suite_by_name() -> None:
    assert [t.id for t in load_tasks("builtin")] == [t.id for t in builtin_tasks()]


def load_error(path: Path) -> str:
    with pytest.raises(TaskLoadError) as info:
        load_tasks(path)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"instruction": None}, "instruction: Input should be a valid string"),
        ({"id": "has space"}, "id: String should match pattern"),
        ({"setup": "echo"}, "setup: Input should be a valid tuple"),
        ({"workspace": {"kind": "directory"}}, "workspace.path: Field required"),
        ({"workspace": {"kind": "tarball", "path": "x"}}, "workspace: Input tag 'tarball'"),
        ({"evaluator": {"kind": "pytest", "timeout_s": -1}}, "evaluator.timeout_s"),
        ({"colour": "red"}, "colour: Extra inputs are not permitted"),
    ],
)
def test_a_bad_field_names_the_line_the_task_and_the_field(
    project: Path, change: dict[str, Any], expected: str
) -> None:
    path = write_jsonl(project / "tasks.jsonl", [row("good"), row("bad") | change])

    message = load_error(path)

    assert message.startswith(f"{path}:2")
    assert expected in message


def test_a_missing_field_names_the_field(project: Path) -> None:
    bad = row("bad")
    del bad["evaluator"]
    path = write_jsonl(project / "tasks.jsonl", [bad])

    assert load_error(path) == f"{path}:1 (task 'bad'): evaluator: Field required"


def test_yaml_errors_name_the_line_of_the_item(project: Path) -> None:
    path = project / "tasks.yaml"
    path.write_text(yaml.safe_dump({"tasks": [row("a"), row("b", setup=[1])]}, sort_keys=False))
    line = next(
        number
        for number, text in enumerate(path.read_text().splitlines(), start=1)
        if "id: b" in text
    )

    message = load_error(path)

    assert message.startswith(f"{path}:{line} (item 2) (task 'b'): setup.0:")


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        (
            "workspace",
            {"kind": "directory", "path": "nowhere"},
            "workspace.path: no such directory",
        ),
        ("hidden_tests", "no-tests", "hidden_tests: no such directory"),
        ("workspace", {"kind": "git", "repo": "gone.git", "commit": "c"}, "no such repository"),
        (
            "workspace",
            {"kind": "git", "repo": "file:///nonexistent/r.git", "commit": "c"},
            "no such repository /nonexistent/r.git",
        ),
    ],
)
def test_a_path_that_does_not_exist(
    project: Path, field: str, value: object, expected: str
) -> None:
    path = write_jsonl(project / "tasks.jsonl", [row(**{field: value})])

    message = load_error(path)

    assert message.startswith(f"{path}:1 (task 't1'): ")
    assert expected in message


def test_duplicate_ids_name_both_rows(project: Path) -> None:
    path = write_jsonl(project / "tasks.jsonl", [row("a"), row("b"), row("a")])

    assert load_error(path) == f"{path}:3: duplicate task id 'a' (first at {path}:1)"


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("tasks.jsonl", b'{"id": "a"}\n{"id": \n', ":2: not valid JSON"),
        ("tasks.jsonl", b"[1, 2]\n", ":1: a task must be an object, got list"),
        ("tasks.jsonl", b"\n\n", ": no tasks in the file"),
        ("tasks.jsonl", b'{"id": "caf\xe9"}\n', ": not UTF-8 text"),
        ("tasks.yaml", b"tasks: [a, b\n", ": not valid YAML"),
        ("tasks.yaml", b"tasks: []\nextra: 1\n", "unexpected keys ['extra']"),
        ("tasks.yaml", b"tasks: {a: 1}\n", "tasks must be a list, got dict"),
        ("tasks.json", b"{", ":1: not valid JSON"),
        ("tasks.parquet", b"PAR1 but not really", ": cannot read Parquet"),
        ("tasks.csv", b"id\n", "unsupported task file type '.csv'"),
    ],
)
def test_a_bad_file(tmp_path: Path, name: str, content: bytes, expected: str) -> None:
    path = tmp_path / name
    path.write_bytes(content)

    message = load_error(path)

    assert message.startswith(str(path))
    assert expected in message


def test_a_source_that_does_not_exist(tmp_path: Path) -> None:
    assert (
        load_error(tmp_path / "missing.jsonl")
        == f"{tmp_path / 'missing.jsonl'}: no such file or directory"
    )


def test_a_directory_without_harbor_tasks(tmp_path: Path) -> None:
    assert "not a Harbor task directory" in load_error(tmp_path)
