"""``polar harness install`` and ``polar harness run`` as a user runs them (real subprocesses)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from polar.harness import PRESETS, Harness, load_harness


def polar(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "polar", "harness", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def one_line(stderr: str) -> str:
    (line,) = stderr.strip().splitlines()
    return line


def test_install_of_the_shell_preset_has_nothing_to_do() -> None:
    result = polar("install", "shell")
    assert result.returncode == 0
    assert result.stdout == "shell: nothing to install\n"


def test_install_of_an_unknown_harness_is_a_one_line_usage_error() -> None:
    result = polar("install", "aider")
    assert result.returncode == 2
    assert one_line(result.stderr).startswith("polar harness install: error: unknown harness")


@pytest.mark.slow
def test_install_keeps_what_the_cache_already_has(
    installed: Callable[[Harness], Path], harness_cache: Path
) -> None:
    path = installed(load_harness("pi"))
    result = polar("install", "pi", "--cache", str(harness_cache))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"kept pi 0.73.1 {path}\n"


def test_list_names_every_preset_its_pinned_cli_and_whether_the_cache_has_it(
    tmp_path: Path,
) -> None:
    result = polar("list", "--cache", str(tmp_path))
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line.split(maxsplit=1)[1] for line in result.stdout.splitlines()}
    assert list(rows) == list(PRESETS)
    assert rows["pi"].split() == ["@mariozechner/pi-coding-agent", "0.73.1", "not", "installed"]
    assert rows["shell"].split() == ["-", "nothing", "to", "install"]


def run_shell(command: str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return polar(
        "run", "shell",
        "--option", f"command={command}",
        "--instruction", "do the thing",
        "--gateway", "http://127.0.0.1:9",
        "--api-key", "sk-test",
        "--workdir", str(tmp_path),
        *extra,
    )  # fmt: skip


def test_run_prints_the_output_and_exits_with_the_harness_status(tmp_path: Path) -> None:
    result = run_shell(
        "bash -c 'echo got: $1; echo $OPENAI_BASE_URL >&2; exit 3' _ {instruction}", tmp_path
    )
    assert result.returncode == 3
    assert result.stdout == "got: do the thing\n"
    assert result.stderr == "http://127.0.0.1:9/v1\n"


def test_run_past_the_timeout_exits_124_with_one_line(tmp_path: Path) -> None:
    result = run_shell("sleep 30", tmp_path, "--timeout-s", "0.5")
    assert result.returncode == 124
    assert one_line(result.stderr) == "polar harness run: error: shell timed out after 0.5 s"


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["aider"], 2, "polar harness run: error: unknown harness 'aider'"),
        (["shell"], 2, "polar harness run: error: shell: needs a command"),
        (["shell", "--option", "oops"], 2, "polar harness run: error: --option expects KEY=VALUE"),
        (
            ["pi", "--option", "colour=red"],
            2,
            "polar harness run: error: harness pi: unknown options",
        ),
    ],
)
def test_run_errors_are_one_line(args: list[str], code: int, message: str, tmp_path: Path) -> None:
    result = polar(
        "run", *args,
        "--instruction", "x", "--gateway", "http://127.0.0.1:9", "--api-key", "k",
        "--workdir", str(tmp_path),
    )  # fmt: skip
    assert result.returncode == code
    assert one_line(result.stderr).startswith(message)


@pytest.mark.slow
def test_run_drives_a_real_cli_through_the_gateway(
    make_stack: Any,
    installed: Callable[[Harness], Path],
    harness_cache: Path,
    tmp_path: Path,
) -> None:
    installed(load_harness("pi"))
    stack = make_stack(
        {
            "turns": [
                {
                    "tool_calls": [
                        {"name": "bash", "arguments": {"command": "echo polar > proof.txt"}}
                    ]
                },
                {"text": "Wrote proof.txt.", "expect": {"last_role": "tool"}},
            ]
        }
    )
    session_id, key = stack.new_session()
    workdir = tmp_path / "work"
    workdir.mkdir()
    result = polar(
        "run", "pi",
        "--instruction", "Write polar into proof.txt",
        "--gateway", stack.url,
        "--workdir", str(workdir),
        "--cache", str(harness_cache),
        "--timeout-s", "120",
        env={**os.environ, "POLAR_API_KEY": key},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Wrote proof.txt." in result.stdout
    assert (workdir / "proof.txt").read_text() == "polar\n"
    stack.engine.assert_clean()
    assert len(stack.records(session_id)) == 2
