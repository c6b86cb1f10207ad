"""``polar dashboard`` as a user starts it: one-line errors for bad flags, and a
real server that answers once started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from polar.proxy.engines.vllm_process import free_port

TOKEN = "cli-dashboard-token-0123456789"
POLAR = [sys.executable, "-m", "polar"]


def polar_dashboard(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "POLAR_CONTROL_TOKEN"}
    return subprocess.run(
        [*POLAR, "dashboard", *args], capture_output=True, text=True, timeout=120, env=env
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--server", "http://127.0.0.1:9"), "--server needs its control token"),
        (("--host", "0.0.0.0"), "--host 0.0.0.0 needs a control token"),
        (("--token", "short"), "16 to 512 visible ASCII characters"),
        (("--token", TOKEN, "--store", "/nonexistent/records.db"), "no record store there"),
        (("--token", TOKEN, "--server", "ftp://x"), "--server must start with http"),
        (("--token", TOKEN, "--builder", "no_such_builder"), "no_such_builder"),
    ],
)
def test_bad_flags_get_one_line_and_exit_2(args: tuple[str, ...], message: str) -> None:
    done = polar_dashboard(*args)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("polar dashboard: error: "), done.stderr
    assert message in lines[0]


@pytest.mark.parametrize("token", [TOKEN, None])
def test_the_dashboard_serves_once_started(tmp_path: Path, token: str | None) -> None:
    """Without a rollout server, a token is not needed: no login then."""
    port = free_port()
    proc = subprocess.Popen(
        [*POLAR, "dashboard", "--port", str(port), *(("--token", token) if token else ())],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={k: v for k, v in os.environ.items() if k != "POLAR_CONTROL_TOKEN"},
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                reply = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
                break
            except httpx.TransportError:
                assert proc.poll() is None, "polar dashboard exited"
                assert time.monotonic() < deadline, "polar dashboard did not start"
                time.sleep(0.2)
        assert reply.json() == {"status": "ok"}
        page = httpx.get(f"http://127.0.0.1:{port}/", timeout=30)
        assert page.status_code == 303 if token else 200
        page = httpx.get(
            f"http://127.0.0.1:{port}/", headers={"authorization": f"Bearer {token}"}, timeout=30
        )
        assert page.status_code == 200
        assert "No rollout server given" in page.text
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
