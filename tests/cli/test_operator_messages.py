"""What ``polar serve``, ``polar submit``, ``polar status`` and ``polar cancel`` tell an
operator, run as a user runs them: real subprocesses, a rollout server and node on
real ports, the ``shell`` harness (no model calls), an engine URL nothing answers."""

from __future__ import annotations

import http.server
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from polar.proxy.engines.vllm_process import free_port

from support.rollout import write_serve_config

NODE_ID = f"node-ops-{os.getpid()}"
"""Node ids are leased machine-wide, and another test run may hold one."""


@dataclass
class Served:
    url: str
    log: Path
    engine_port: int

    def env(self, token: str) -> dict[str, str]:
        return {**os.environ, "POLAR_CONTROL_TOKEN": token}


def polar(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "polar", *args], capture_output=True, text=True, timeout=120, env=env
    )


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    """``polar serve`` with a generated control token, its output in a file."""
    port, engine_port = free_port(), free_port()
    config = write_serve_config(
        tmp_path,
        port=port,
        node_id=NODE_ID,
        heartbeat_s=0.3,
        engine=f'{{kind: vllm, base_url: "http://127.0.0.1:{engine_port}", model: none}}',
    )
    log = tmp_path / "serve.log"
    command = [sys.executable, "-m", "polar", "serve", "-c", str(config)]
    with log.open("w") as out, subprocess.Popen(command, stdout=out, stderr=out) as proc:
        try:
            deadline = time.monotonic() + 60
            while "control token" not in log.read_text():
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
            yield Served(f"http://127.0.0.1:{port}", log, engine_port)
        finally:
            proc.terminate()
            proc.wait(30)


def token_of(served: Served) -> str:
    (line,) = [line for line in served.log.read_text().splitlines() if "control token" in line]
    return line.rsplit(" ", 1)[1]


def wait_for_node(served: Served, token: str) -> list[dict[str, object]]:
    deadline = time.monotonic() + 30
    while True:
        nodes: list[dict[str, object]] = httpx.get(
            f"{served.url}/nodes", headers={"authorization": f"Bearer {token}"}
        ).json()
        if nodes and nodes[0]["engine_error"]:
            return nodes
        assert time.monotonic() < deadline, served.log.read_text()
        time.sleep(0.1)


def test_serve_says_where_it_listens_then_the_token_and_no_heartbeats(served: Served) -> None:
    token = token_of(served)
    wait_for_node(served, token)
    time.sleep(1.5)  # five heartbeats

    lines = served.log.read_text().splitlines()
    (ready,) = [i for i, line in enumerate(lines) if line.startswith("polar serve: ready: ")]
    assert f"rollout server {served.url}" in lines[ready]
    assert f"node {NODE_ID} (gateway http://127.0.0.1:" in lines[ready]
    assert lines[ready + 1].startswith("polar serve: control token (generated;")
    assert not [line for line in lines if "heartbeat" in line]


def test_a_node_whose_engine_does_not_answer_is_reported_unhealthy(served: Served) -> None:
    token = token_of(served)
    (node,) = wait_for_node(served, token)

    shown = polar("status", "--server", served.url, env=served.env(token))

    assert shown.returncode == 0, shown.stderr
    engine = f"http://127.0.0.1:{served.engine_port}"
    assert node["healthy"] is False
    assert f"{NODE_ID} " in shown.stdout
    assert f"unhealthy (engine {engine} unreachable: " in shown.stdout
    assert f"engine {engine} unreachable" in served.log.read_text()

    # An engine that answers, even without a /v1/models route, makes the node healthy.
    answering = http.server.HTTPServer(("127.0.0.1", served.engine_port), NotFound)
    threading.Thread(target=answering.serve_forever, daemon=True).start()
    try:
        deadline = time.monotonic() + 30
        while "unhealthy" in polar("status", "--server", served.url, env=served.env(token)).stdout:
            assert time.monotonic() < deadline, served.log.read_text()
            time.sleep(0.3)
    finally:
        answering.shutdown()
        answering.server_close()
    assert f"engine {engine}/v1/models answers again" in served.log.read_text()


class NotFound(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_error(404)

    def log_message(self, format: str, *args: object) -> None:
        pass


def write_slow_task(tmp_path: Path) -> Path:
    (tmp_path / "repo").mkdir()
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        '{"id": "slow", "instruction": "wait", "workspace": {"kind": "directory", '
        '"path": "repo"}, "evaluator": {"kind": "command", "config": {"command": "true"}}}\n'
    )
    return tasks


def test_ctrl_c_on_submit_says_the_task_goes_on_and_cancel_stops_it(
    served: Served, tmp_path: Path
) -> None:
    token = token_of(served)
    env = served.env(token)
    tasks = write_slow_task(tmp_path)
    argv = ["submit", str(tasks), "--harness", "shell", "--option", "command=sleep 120"]
    argv += ["--samples", "1", "--server", served.url]
    submit = subprocess.Popen(
        [sys.executable, "-m", "polar", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert submit.stdout is not None
    first = submit.stdout.readline()
    assert first.startswith("submitted t-"), first
    task_id = first.split()[1]
    time.sleep(1.0)  # following its progress now

    submit.send_signal(signal.SIGINT)
    _, err = submit.communicate(timeout=30)

    assert submit.returncode == 130
    assert err.splitlines() == [
        f"polar submit: interrupted; the submitted tasks go on running on the server: {task_id}",
        f"  follow them with: polar status --server {served.url} TASK",
        f"  cancel them with: polar cancel --server {served.url} {task_id}",
    ]
    assert polar("status", task_id, "--server", served.url, env=env).stdout.find("[running]") > 0

    cancelled = polar("cancel", task_id, "--server", served.url, env=env)

    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.startswith(f"{task_id} slow: ")
    deadline = time.monotonic() + 30
    while "[cancelled]" not in polar("status", task_id, "--server", served.url, env=env).stdout:
        assert time.monotonic() < deadline
        time.sleep(0.3)


def test_cancel_of_an_unknown_task_says_so(served: Served) -> None:
    env = served.env(token_of(served))

    result = polar("cancel", "t-nope", "--server", served.url, env=env)

    assert result.returncode == 1
    assert result.stderr.strip() == "polar cancel: error: no task t-nope"
    no_token = polar("cancel", "t-nope", "--server", served.url, env=dict(os.environ))
    assert no_token.returncode == 2
    assert no_token.stderr.strip() == "polar cancel: error: missing or wrong control token"
