"""Bad input to ``polar generate`` and ``polar sft``: one line on stderr naming
the problem, a non-zero exit, and nothing written. (Successful runs are in
``tests/sft/test_generate.py``.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from polar.cli import app
from polar.sft.generate import GenerateConfig
from polar.sft.journal import Journal
from polar.tasks.builtin import builtin_task

ENGINE = ("--engine-url", "http://127.0.0.1:9", "--engine-model", "m")


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("nowhere.jsonl",), "nowhere.jsonl"),
        (("builtin", "--task", "fix-nothing"), "no task fix-nothing in builtin"),
        (("builtin", "--accept", "__import__('os')"), "--accept \"__import__('os')\": call"),
        (("builtin", "--accept", "reward >="), "--accept 'reward >=': not an expression"),
        (("builtin", "--accept", "score > 1"), "unknown name 'score'"),
        (("builtin", "--attempts", "0"), "attempts"),
        (("builtin", "--format", "csv"), "formats"),
        (("builtin", "--format", "jsonl", "--format", "jsonl"), "each export format at most once"),
        (("builtin", "--option", "nokey"), "--option wants KEY=VALUE, not 'nokey'"),
        (("builtin", "--max-in-flight", "0"), "max_in_flight"),
        (("builtin", "--timeout", "-1"), "session_timeout_s"),
        (("builtin",), "no engine: give --engine-url and --engine-model, or --config"),
    ],
)
def test_generate_refuses_bad_input_in_one_line(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    out = tmp_path / "out"
    engine = ENGINE if args != ("builtin",) else ()
    code, stderr = run("generate", *args, "--harness", "shell", "--out", str(out), *engine)
    assert code == 2
    assert stderr.startswith("polar generate: error: ") and stderr.count("\n") == 1, stderr
    assert message in stderr
    assert not out.exists()


def test_generate_refuses_a_missing_service_config(tmp_path: Path) -> None:
    missing = tmp_path / "service.yaml"
    code, stderr = run(
        "generate", "builtin", "--harness", "shell", "--out", str(tmp_path / "out"),
        "--config", str(missing),
    )  # fmt: skip
    assert code == 2 and stderr.startswith("polar generate: error: "), stderr
    assert str(missing) in stderr


def test_generate_into_a_run_made_with_other_settings_is_refused(tmp_path: Path) -> None:
    """The journal is checked before the local service starts: refused at once."""
    out = tmp_path / "out"
    task = builtin_task("fix-median")
    first = GenerateConfig(
        out=out, harness={"name": "shell", "options": {"command": "true"}}, attempts=1
    )
    Journal(out / "journal.sqlite", settings=first.settings, tasks=[task], server="x").close()
    code, stderr = run(
        "generate", "builtin", "--task", "fix-median", "--harness", "shell",
        "--option", "command=false", "--out", str(out), *ENGINE,
    )  # fmt: skip
    assert code == 2, stderr
    assert stderr.startswith("polar generate: error: ") and stderr.count("\n") == 1, stderr
    assert "this run used harness" in stderr and "use another --out" in stderr


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """Enough of a model directory to pass the checks made before loading one."""
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text("{}")
    return path


@pytest.fixture
def tokens(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.jsonl"
    path.write_text(
        '{"input_ids": [1, 2, 3], "labels": [-100, 2, 3], "attention_mask": [1, 1, 1]}\n'
    )
    return path


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("no data", "no such file"),
        ("empty dir", "no tokens.parquet or tokens.jsonl in this directory"),
        ("bad row", "row 1: a label is neither -100 nor its input token"),
        ("no model", "not a model directory (no config.json)"),
        ("too long", "no row to train on"),
        ("epochs", "epochs"),
        ("device", "device"),
        ("out is data", "holds the data; choose another --out"),
        ("out is a dir", "a non-empty directory that is not a polar sft output"),
    ],
)
def test_sft_refuses_bad_input_in_one_line(
    tmp_path: Path, tokens: Path, model: Path, case: str, message: str
) -> None:
    data, extra = tokens, []
    match case:
        case "no data":
            data = tmp_path / "missing.parquet"
        case "empty dir":
            data = tmp_path / "empty"
            data.mkdir()
        case "bad row":
            data.write_text(
                '{"input_ids": [1, 2], "labels": [-100, 7], "attention_mask": [1, 1]}\n'
            )
        case "no model":
            model = tmp_path / "empty-model"
            model.mkdir()
        case "too long":
            extra = ["--max-length", "2"]
        case "epochs":
            extra = ["--epochs", "0"]
        case "device":
            extra = ["--device", "tpu"]
    out = tmp_path / "out"
    match case:
        case "out is data":
            out = tmp_path
        case "out is a dir":
            out.mkdir()
            (out / "notes.txt").write_text("mine")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    code, stderr = run("sft", str(data), "--model", str(model), "--out", str(out), *extra)
    assert code == 2
    assert stderr.startswith("polar sft: error: ") and stderr.count("\n") == 1, stderr
    assert message in stderr
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
