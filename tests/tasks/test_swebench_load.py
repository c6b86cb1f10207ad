"""SWE-bench style instances load as tasks, from rows and from files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow
import pyarrow.parquet
import pytest

from polar.runtime import RuntimeSpec
from polar.tasks import GitWorkspace, ImageWorkspace, TaskLoadError, load_swebench, load_tasks


def instance(**fields: Any) -> dict[str, Any]:
    return {
        "instance_id": "acme__calc-101",
        "repo": "acme/calc",
        "base_commit": "0123456789abcdef0123456789abcdef01234567",
        "problem_statement": "add(2, 2) returns 5.",
        "test_patch": "diff --git a/tests/test_add.py b/tests/test_add.py\n",
        # As in the Hugging Face dataset: JSON text, not lists.
        "FAIL_TO_PASS": '["tests/test_add.py::test_small"]',
        "PASS_TO_PASS": '["tests/test_add.py::test_zero", "tests/test_mul.py::test_one"]',
        "version": 1.2,
        "created_at": "2024-01-02T03:04:05Z",
        "patch": "the gold patch",
        "hints_text": "",
        **fields,
    }


@pytest.fixture
def mirrors(tmp_path: Path) -> Path:
    (tmp_path / "acme__calc").mkdir()
    return tmp_path


def test_an_instance_row_becomes_a_git_task_scored_by_swebench(mirrors: Path) -> None:
    task = load_swebench(instance(), repo_url=f"file://{mirrors}/{{repo_dir}}")

    assert task.id == "acme__calc-101"
    assert task.instruction == "add(2, 2) returns 5."
    assert task.workspace == GitWorkspace(
        repo=f"file://{mirrors}/acme__calc", commit="0123456789abcdef0123456789abcdef01234567"
    )
    assert task.evaluator.kind == "swebench"
    assert task.evaluator.fresh_runtime
    assert task.evaluator.config == {
        "fail_to_pass": ["tests/test_add.py::test_small"],
        "pass_to_pass": ["tests/test_add.py::test_zero", "tests/test_mul.py::test_one"],
        "test_patch": "diff --git a/tests/test_add.py b/tests/test_add.py\n",
    }
    assert task.metadata["version"] == "1.2"
    assert task.metadata["repo"] == "acme/calc"
    assert "the gold patch" not in json.dumps(task.model_dump(mode="json"))


def test_lists_as_lists_and_setup_commands(mirrors: Path) -> None:
    task = load_swebench(
        instance(FAIL_TO_PASS=["a.py::t"], PASS_TO_PASS=[]),
        repo_url=str(mirrors / "{repo_dir}"),
        setup=["pip install -e ."],
    )

    assert task.evaluator.config["fail_to_pass"] == ["a.py::t"]
    assert task.evaluator.config["pass_to_pass"] == []
    assert task.setup == ("pip install -e .",)
    assert task.workspace == GitWorkspace(
        repo=str(mirrors / "acme__calc"), commit="0123456789abcdef0123456789abcdef01234567"
    )


def test_image_from_the_row_or_from_a_template() -> None:
    from_row = load_swebench(instance(image_name="registry/calc:101"))
    from_template = load_swebench(instance(), image="swebench/sweb.eval.x86_64.{docker_id}:latest")

    assert from_row.workspace == ImageWorkspace(image="registry/calc:101", path="/testbed")
    assert from_template.workspace == ImageWorkspace(
        image="swebench/sweb.eval.x86_64.acme_1776_calc-101:latest", path="/testbed"
    )
    assert from_template.runtime == RuntimeSpec(
        image="swebench/sweb.eval.x86_64.acme_1776_calc-101:latest", workdir="/testbed"
    )
    assert from_template.runtime.model_fields_set == {"image", "workdir"}


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"base_commit": None}, "base_commit: Input should be a valid string"),
        ({"FAIL_TO_PASS": "[not json"}, "FAIL_TO_PASS: Value error, not a list of test ids"),
        ({"FAIL_TO_PASS": "[]"}, "FAIL_TO_PASS: Tuple should have at least 1 item"),
        ({"PASS_TO_PASS": [1]}, "PASS_TO_PASS.0: Input should be a valid string"),
        ({"instance_id": "bad id"}, "id: String should match pattern"),
    ],
)
def test_a_bad_instance_names_the_field(change: dict[str, Any], expected: str) -> None:
    with pytest.raises(TaskLoadError) as info:
        load_swebench(instance(**change), image="x", where="row 7")

    assert str(info.value).startswith("row 7")
    assert expected in str(info.value)


def test_a_missing_field() -> None:
    row = instance()
    del row["problem_statement"]

    with pytest.raises(
        TaskLoadError, match=r"'acme__calc-101'\): problem_statement: Field required"
    ):
        load_swebench(row, image="x")


def test_a_repository_that_does_not_exist(tmp_path: Path) -> None:
    with pytest.raises(TaskLoadError, match="repo: no such repository"):
        load_swebench(instance(), repo_url=f"file://{tmp_path}/{{repo_dir}}")


def test_files_of_instances_jsonl_and_parquet(tmp_path: Path) -> None:
    rows = [instance(), instance(instance_id="acme__calc-102")]
    jsonl = tmp_path / "instances.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    parquet = tmp_path / "instances.parquet"
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), parquet)

    for path in (jsonl, parquet):
        tasks = load_swebench(path, image="img-{instance_id}")
        assert [t.id for t in tasks] == ["acme__calc-101", "acme__calc-102"]
        assert tasks[1].workspace == ImageWorkspace(image="img-acme__calc-102", path="/testbed")


def test_duplicate_instances_in_a_file(tmp_path: Path) -> None:
    path = tmp_path / "instances.jsonl"
    path.write_text(
        json.dumps(instance(image_name="i")) + "\n" + json.dumps(instance(image_name="i"))
    )

    with pytest.raises(TaskLoadError, match=":2: duplicate task id 'acme__calc-101'"):
        load_swebench(path)


def test_instance_rows_mixed_into_a_task_file(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    task_row = {
        "id": "plain",
        "instruction": "x",
        "workspace": {"kind": "directory", "path": "repo"},
        "evaluator": {"kind": "command", "config": {"command": "true"}},
    }
    path = tmp_path / "mixed.jsonl"
    path.write_text(json.dumps(task_row) + "\n" + json.dumps(instance(image_name="img")) + "\n")

    plain, swe = load_tasks(path)

    assert plain.evaluator.kind == "command"
    assert swe.evaluator.kind == "swebench"
    assert swe.workspace == ImageWorkspace(image="img", path="/testbed")
