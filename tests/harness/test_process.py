"""The local subprocess runner: exit codes, captured output, stdin closed, group kills."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from polar.harness import InvalidRunSpec, ProcessResult, Stream, run_process

ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "ONLY": "this"}


def bash(
    script: str,
    tmp_path: Path,
    *,
    timeout_s: float = 30.0,
    on_output: Callable[[Stream, str], None] | None = None,
) -> ProcessResult:
    return run_process(
        ["bash", "-c", script], cwd=tmp_path, env=ENV, timeout_s=timeout_s, on_output=on_output
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by init) counts as gone.
    status = Path(f"/proc/{pid}/status").read_text()
    return "State:\tZ" not in status


def wait_gone(pid: int, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_output_and_exit_code_are_captured(tmp_path: Path) -> None:
    result = bash("echo out; echo err >&2; exit 3", tmp_path)
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 3)
    assert not result.timed_out and not result.ok


def test_runs_in_cwd_with_exactly_the_given_environment(tmp_path: Path) -> None:
    result = bash("pwd; env | sort", tmp_path)
    lines = result.stdout.splitlines()
    assert lines[0] == str(tmp_path)
    names = {line.split("=", 1)[0] for line in lines[1:]}
    # bash adds PWD, SHLVL and _ itself; nothing comes from the caller's environment.
    assert names <= {"PATH", "ONLY", "PWD", "SHLVL", "_"}
    assert "ONLY=this" in lines


def test_stdin_is_closed(tmp_path: Path) -> None:
    result = bash("cat; echo done", tmp_path, timeout_s=10)
    assert result.ok and result.stdout == "done\n"


def test_output_is_streamed_line_by_line(tmp_path: Path) -> None:
    seen: list[tuple[Stream, str]] = []
    lock = threading.Lock()

    def collect(stream: Stream, line: str) -> None:
        with lock:
            seen.append((stream, line))

    bash("echo a; echo b >&2; echo c", tmp_path, on_output=collect)
    assert [line for stream, line in seen if stream is Stream.STDOUT] == ["a\n", "c\n"]
    assert (Stream.STDERR, "b\n") in seen


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    result = bash(f"sleep 300 & echo $! > {pids}; sleep 300", tmp_path, timeout_s=1)
    assert result.timed_out and not result.ok
    assert result.duration_s < 10
    assert wait_gone(int(pids.read_text()))


def test_a_child_that_ignores_sigterm_is_killed(tmp_path: Path) -> None:
    result = bash("trap '' TERM; sleep 300", tmp_path, timeout_s=0.5)
    assert result.timed_out
    assert result.exit_code == -9


def test_leftover_background_processes_are_killed_when_the_run_ends(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    result = bash(f"sleep 300 & echo $! > {pids}; exit 0", tmp_path)
    assert result.ok and result.duration_s < 10
    assert wait_gone(int(pids.read_text()))


def test_a_missing_program_or_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidRunSpec, match="cannot start no-such-program-xyz"):
        run_process(["no-such-program-xyz"], cwd=tmp_path, env=ENV, timeout_s=5)
    with pytest.raises(InvalidRunSpec, match="does not exist"):
        run_process(["true"], cwd=tmp_path / "missing", env=ENV, timeout_s=5)
