"""``polar dashboard --server`` checks its control token with the rollout server at
start and says what it found, in the terminal: a real rollout server (in this
process) and the real ``polar`` entry point."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from polar.proxy.engines.vllm_process import free_port
from polar.rollout.config import ServerConfig
from polar.rollout.server.app import create_server_app
from polar.rollout.server.service import RolloutServer
from polar.serverthread import ServerThread

TOKEN = "dashboard-check-token-0123456789"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    config = ServerConfig(port=0, db=tmp_path / "rollout.db", control_token=TOKEN)
    with ServerThread(create_server_app(RolloutServer(config))) as thread:
        yield thread.url


def start(*args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "POLAR_CONTROL_TOKEN"}
    return subprocess.Popen(
        [sys.executable, "-m", "polar", "dashboard", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )


def first_lines(proc: subprocess.Popen[str], n: int) -> list[str]:
    """The first ``n`` lines it prints, then it is stopped."""
    assert proc.stderr is not None
    try:
        return [proc.stderr.readline().rstrip("\n") for _ in range(n)]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=30)


def test_a_token_the_server_takes_is_said_then_where_to_log_in(server: str) -> None:
    port = free_port()

    lines = first_lines(start("--server", server, "--token", TOKEN, "--port", str(port)), 2)

    assert lines == [
        f"polar dashboard: rollout server {server} takes the control token",
        f"polar dashboard: ready: http://127.0.0.1:{port}/ (log in with the control token)",
    ]


def test_a_token_the_server_refuses_is_a_one_line_error(server: str) -> None:
    wrong = "not-the-servers-token-0123456789"

    done = subprocess.run(
        [sys.executable, "-m", "polar", "dashboard", "--server", server, "--token", wrong],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "POLAR_CONTROL_TOKEN"},
    )

    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"polar dashboard: error: rollout server {server} refuses this control token: give "
        "the one polar serve uses (--token or POLAR_CONTROL_TOKEN)"
    )


def test_a_server_that_does_not_answer_is_a_warning_and_the_dashboard_starts() -> None:
    silent, port = f"http://127.0.0.1:{free_port()}", free_port()

    lines = first_lines(start("--server", silent, "--token", TOKEN, "--port", str(port)), 2)

    assert lines[0].startswith(
        f"polar dashboard: warning: rollout server {silent} does not answer ("
    )
    assert lines[0].endswith("); its tasks show once it does")
    assert lines[1] == (
        f"polar dashboard: ready: http://127.0.0.1:{port}/ (log in with the control token)"
    )
