"""``polar serve``, ``polar submit`` and ``polar status`` as a user runs them:
real subprocesses, a real rollout server and node on real ports, the real
local sandbox. The agent is the ``shell`` harness (no model calls), so no
engine is needed: the node's gateway points at a port nothing listens on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from polar.proxy.engines.vllm_process import free_port

from support.rollout import write_serve_config

TOKEN = "cli-control-token-0123456789"


def polar(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "polar", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


NODE_ID = f"node-cli-{os.getpid()}"
"""The served node's id: node ids are leased machine-wide, and another test run may hold one."""


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    port, node_port = free_port(), free_port()
    config = write_serve_config(
        tmp_path,
        port=port,
        node_id=NODE_ID,
        gateway_port=node_port,
        heartbeat_s=0.5,
        engine=f'{{kind: vllm, base_url: "http://127.0.0.1:{free_port()}", model: none}}',
    )
    command = [sys.executable, "-m", "polar", "serve", "-c", str(config), "--token", TOKEN]
    with (
        (tmp_path / "serve.log").open("w") as log,
        subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT) as proc,
    ):
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    nodes = httpx.get(
                        f"{url}/nodes", headers={"authorization": f"Bearer {TOKEN}"}
                    ).json()
                    if nodes:
                        break
                except httpx.HTTPError:
                    pass
                assert proc.poll() is None, (tmp_path / "serve.log").read_text()
                assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
                time.sleep(0.2)
            yield url
        finally:
            proc.terminate()
            proc.wait(30)


def write_tasks(tmp_path: Path) -> Path:
    workspace = tmp_path / "repo"
    workspace.mkdir()
    (workspace / "README").write_text("make a file named done\n")
    tasks = tmp_path / "tasks.jsonl"
    row = {
        "id": "make-done",
        "instruction": "Create a file named done.",
        "workspace": {"kind": "directory", "path": "repo"},
        "evaluator": {"kind": "command", "config": {"command": "test -f done"}},
    }
    tasks.write_text(json.dumps(row) + "\n")
    return tasks


def test_submit_runs_a_group_and_status_shows_it(served: str, tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path)
    out = tmp_path / "results.jsonl"
    env = {"POLAR_CONTROL_TOKEN": TOKEN}

    result = polar(
        "submit", str(tasks), "--harness", "shell", "--option", "command=touch done",
        "--samples", "2", "--server", served, "--out", str(out), env=env,
    )  # fmt: skip

    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("submitted t-") and lines[0].endswith("(make-done, 2 sessions)")
    assert "make-done: completed, usable 2/2, mean reward 1.000" in lines[-1]
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["reward"] for r in row["results"]] == [1.0, 1.0]

    shown = polar("status", "--server", served, env=env)
    assert shown.returncode == 0, shown.stderr
    assert NODE_ID in shown.stdout and "make-done [completed]" in shown.stdout
    one = polar("status", row["task_id"], "--server", served, env=env)
    assert f"{row['task_id']}-s0 completed  reward 1" in one.stdout


def test_client_commands_fail_in_one_line(served: str, tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path)
    no_token = polar("status", "--server", served)
    assert no_token.returncode == 2
    assert no_token.stderr.strip() == "polar status: error: missing or wrong control token"

    missing = polar("submit", str(tmp_path / "nope.jsonl"), "--harness", "shell")
    assert missing.returncode == 2
    assert missing.stderr.strip().startswith("polar submit: error: ")
    assert len(missing.stderr.strip().splitlines()) == 1

    bad_option = polar("submit", str(tasks), "--harness", "shell", "--option", "novalue")
    assert bad_option.stderr.strip() == (
        "polar submit: error: --option wants KEY=VALUE, not 'novalue'"
    )


def test_serve_rejects_a_bad_config_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text("server:\n  port: -1\nnode: {}\n")
    result = polar("serve", "-c", str(config), "--check")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "polar serve: error: server.port: Input should be greater than or equal to 0; "
        "node.gateway.engine: field required"  # every problem at once
    )


def test_the_documented_command_lines_validate(tmp_path: Path) -> None:
    """The README's and docs/deploy's serve and node lines, from flags alone."""
    url = ("--engine-url", "http://127.0.0.1:8011")
    serve = polar("serve", "--engine-kind", "embedded", *url, "--engine-model", "tiny", "--check")
    assert serve.returncode == 0, serve.stderr
    engine = json.loads(serve.stdout)["node"]["gateway"]["engine"]
    assert (engine["kind"], engine["model"]) == ("embedded", "tiny")
    node = polar("node", *url, "--engine-model", "policy", "--token", TOKEN, "--check")
    assert node.returncode == 0, node.stderr
    assert json.loads(node.stdout)["gateway"]["engine"]["model"] == "policy"
    ray = polar("serve", *url, "--engine-model", "m", "--backend", "ray", "--ray-nodes", "4",
                "--check")  # fmt: skip
    assert ray.returncode == 0, ray.stderr
    assert (json.loads(ray.stdout)["backend"], json.loads(ray.stdout)["ray"]["nodes"]) == ("ray", 4)
    bad = polar("serve", *url, "--engine-model", "m", "--backend", "slurm", "--check")
    assert bad.returncode == 2
    assert bad.stderr.strip() == "polar serve: error: backend: Input should be 'local' or 'ray'"


def test_check_prints_no_secret(tmp_path: Path) -> None:
    """``--check`` shows the settings without the control token, the gateway's admin
    token or the engine's API key, wherever they came from."""
    admin, api_key = "admin-token-secret-0123456789", "engine-api-key-secret-0123"
    config = tmp_path / "serve.yaml"
    config.write_text(
        f"""
node:
  control_port: {free_port()}
  gateway:
    admin_token: {admin}
    engine: {{kind: vllm, base_url: "http://127.0.0.1:9", model: m, api_key: {api_key}}}
"""
    )
    node_config = tmp_path / "node.yaml"
    node_config.write_text(config.read_text().replace("node:\n", "", 1).replace("\n  ", "\n"))
    runs = {
        "serve": polar("serve", "-c", str(config), "--token", TOKEN, "--check"),
        "serve (environment)": polar(
            "serve", "-c", str(config), "--check", env={"POLAR_CONTROL_TOKEN": TOKEN}
        ),
        "serve (generated)": polar("serve", "-c", str(config), "--check"),
        "node": polar("node", "-c", str(node_config), "--token", TOKEN, "--check"),
    }
    for name, run in runs.items():
        assert run.returncode == 0, (name, run.stderr)
        assert isinstance(json.loads(run.stdout), dict), name
        text = run.stdout + run.stderr
        for secret in (TOKEN, admin, api_key):
            assert secret not in text, (name, secret)
        assert "control_token" not in run.stdout, name
    assert json.loads(runs["node"].stdout)["gateway"]["engine"]["model"] == "m"
    assert "serve (generated)" in runs and "control token" not in runs["serve (generated)"].stderr


def test_a_node_needs_the_control_token_and_refuses_a_bad_one(tmp_path: Path) -> None:
    config = tmp_path / "node.yaml"
    config.write_text(
        'gateway:\n  engine: {kind: vllm, base_url: "http://127.0.0.1:9", model: m}\n'
    )
    missing = polar("node", "-c", str(config), "--check", env={"POLAR_CONTROL_TOKEN": ""})
    assert missing.returncode == 2
    assert "control token is needed" in missing.stderr
    bad = polar("node", "-c", str(config), "--token", "tökén-0123456789-abcdef", "--check")
    assert bad.returncode == 2
    assert "visible ASCII" in bad.stderr and bad.stderr.count("\n") == 1
