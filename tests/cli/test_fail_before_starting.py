"""Commands fail before starting, not after: through the real ``polar`` entry point,
a harness that cannot run, a port already taken, a config start-up would refuse
or a missing file is one line ``polar <cmd>: error: ...`` and a non-zero exit,
and nothing is loaded, sent or started first."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from polar.proxy.engines.vllm_process import free_port

from support.rollout import write_serve_config

TOKEN = "cli-control-token-0123456789"
ADMIN = "admin-token-0123456789"


def polar(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "polar", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "POLAR_CONTROL_TOKEN": TOKEN},
    )


def one_line(run: subprocess.CompletedProcess[str], command: str) -> str:
    """The run's only line of output: its error, after ``polar <command>: error: ``."""
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert run.stdout == ""
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.stderr
    prefix = f"polar {command}: error: "
    assert lines[0].startswith(prefix), lines[0]
    return lines[0].removeprefix(prefix)


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A port something listens on (and accepts nothing from)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        sock.setblocking(False)
        yield sock


def nothing_connected(sock: socket.socket) -> bool:
    try:
        sock.accept()[0].close()
    except BlockingIOError:
        return True
    return False


# ------------------------------------------------------------------ polar submit


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ("--harness", "nope"),
            "--harness: unknown harness 'nope'; use one of ['claude_code', 'codex', "
            "'gemini_cli', 'mini_swe_agent', 'minicoder', 'opencode', 'pi', 'qwen_code', "
            "'shell'] or 'package.module:factory'",
        ),
        (("--harness", "shell"), "--option: shell: needs a command (option command=...)"),
        (
            ("--harness", "minicoder", "--option", "max_turns=two"),
            "--option: harness minicoder: max_turns: Input should be a valid integer, "
            "unable to parse string as an integer",
        ),
    ],
)
def test_submit_refuses_a_harness_that_cannot_run_before_sending_anything(
    listener: socket.socket, flags: tuple[str, ...], message: str
) -> None:
    server = f"http://127.0.0.1:{listener.getsockname()[1]}"

    run = polar("submit", "builtin", *flags, "--server", server)

    assert one_line(run, "submit") == message
    assert nothing_connected(listener)


# ---------------------------------------------------------------- ports in use


def serve_file(tmp_path: Path, port: int) -> Path:
    engine = '{kind: embedded, base_url: "http://127.0.0.1:9", model: m}'
    return write_serve_config(tmp_path, port=port, engine=engine)


@pytest.mark.parametrize(
    ("command", "flags", "setting"),
    [
        ("serve", ("-c", "{serve}"), "--port or server.port"),
        ("serve", ("--node-port", "{port}"), "--node-port or node.gateway.port"),
        ("node", ("--port", "{port}"), "--port or gateway.port"),
        ("node", ("--control-port", "{port}"), "--control-port or control_port"),
        ("gateway", ("--port", "{port}", "--admin-token", ADMIN), "--port or port"),
        ("engine serve", ("--port", "{port}", "--model", "{model}"), "--port"),
        ("engine scripted", ("--port", "{port}", "--script", "{script}"), "--port"),
        ("dashboard", ("--port", "{port}"), "--port"),
    ],
)
def test_a_port_in_use_is_one_line_before_anything_loads(
    listener: socket.socket,
    tmp_path: Path,
    command: str,
    flags: tuple[str, ...],
    setting: str,
) -> None:
    port = listener.getsockname()[1]
    engine = ("--engine-url", "http://127.0.0.1:9", "--engine-model", "m")
    if command in ("node", "gateway"):
        flags = (*flags, *engine)
    if command == "node" and "--control-port" in flags:
        flags = (*flags, "--port", str(free_port()))
    if command == "serve" and "-c" not in flags:
        flags = (*flags, *engine, "--port", str(free_port()), "--db", str(tmp_path / "r.db"))
    (tmp_path / "config.json").write_text("{}")  # what engine serve looks for in --model
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"sessions": [{"turns": [{"text": "hi"}]}]}))
    where = {"port": port, "serve": serve_file(tmp_path, port), "model": tmp_path, "script": script}
    filled = [f.format(**where) for f in flags]

    run = polar(*command.split(), *filled)

    assert one_line(run, command) == (
        f"cannot listen on 127.0.0.1:{port} (Address already in use); "
        f"choose another port with {setting}"
    )


# ---------------------------------------------------------------- polar serve


def test_serve_check_runs_the_checks_start_up_runs(tmp_path: Path) -> None:
    """The file and the flags follow the same rules: the embedded engine captures
    token-in/token-out either way, and a capture it cannot serve fails ``--check``."""
    config = serve_file(tmp_path, free_port())

    checked = polar("serve", "-c", str(config), "--check")
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout)["node"]["gateway"]["capture"] == "token_in_token_out"

    config.write_text(
        config.read_text().replace("  gateway:\n", "  gateway:\n    capture: engine_rendered\n")
    )
    for args in (("--check",), ()):
        run = polar("serve", "-c", str(config), *args)
        assert one_line(run, "serve") == (
            "node.gateway.engine: Value error, the embedded engine takes token ids: "
            "use capture: token_in_token_out (its default)"
        )

    config = serve_file(tmp_path, free_port())
    nowhere = tmp_path / "no-tokenizer-here"
    config.write_text(
        config.read_text().replace(
            "    store:", f"    render: {{tokenizer: {nowhere}}}\n    store:"
        )
    )
    run = polar("serve", "-c", str(config), "--check")
    assert one_line(run, "serve").startswith(
        f"node.gateway.render.tokenizer: cannot load a tokenizer from {nowhere} ("
    )

    config.write_text(config.read_text().replace("kind: embedded", "kind: no_such_engine_xyz:E"))
    run = polar("serve", "-c", str(config), "--check")
    assert one_line(run, "serve") == (
        "node.gateway.engine.kind: engine no_such_engine_xyz:E: cannot import "
        "no_such_engine_xyz (No module named 'no_such_engine_xyz')"
    )


# ---------------------------------------------------------------- polar train


def test_train_says_a_missing_file_is_missing_before_loading_the_trainer(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"

    run = polar("train", str(missing))

    assert one_line(run, "train") == f"{missing}: cannot read (No such file or directory)"
    # What reads and checks a training config loads no torch (seconds of imports).
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, polar.cli, polar.train.config; print('torch' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert probe.stdout.strip() == "False", probe.stderr


def test_train_without_gateways_needs_the_control_token_to_ask_for_them(tmp_path: Path) -> None:
    config = tmp_path / "train.yaml"
    config.write_text(
        f"""
model: {tmp_path / "model"}
steps: 1
rollout: {{tasks: builtin, harness: {{name: minicoder}}}}
weight_sync:
  engines: [{{kind: embedded, url: "http://127.0.0.1:9"}}]
"""
    )

    run = polar("train", str(config))

    assert one_line(run, "train") == (
        f"{config}: config: Value error, weight_sync.gateways: list them, or give "
        "rollout.control_token so the rollout server tells the trainer its nodes' gateways"
    )
