"""A whole rollout service on this machine for tests: the scripted engine (or
any engine given by its gateway config), a rollout server and a gateway node
(its gateway and its API on two ports, served from one event loop as ``polar
node`` does), each a real HTTP server.

The node runs sessions in the real ``local`` runtime (bubblewrap) with the real
harness CLIs from ``.cache/harness``; only the model is scripted.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from polar.rollout.client import RolloutClient
from polar.rollout.config import NodeConfig, ServerConfig
from polar.rollout.deploy import NodeService, NodeThread, node_service
from polar.rollout.server.app import create_server_app
from polar.rollout.server.service import RolloutServer
from polar.serverthread import ServerThread
from polar.tasks.builtin import solution_patch, wrong_patch
from polar.testing.scripted import ScriptedEngine, script_from_dict

from support.paths import REPO

CONTROL_TOKEN = "test-control-token-0123456789"
HARNESS_CACHE = REPO / ".cache" / "harness"
SHELL_TOOLS = {
    "qwen_code": ("run_shell_command", "command"),
    "pi": ("bash", "command"),
    "mini_swe_agent": ("bash", "command"),
    "opencode": ("bash", "command"),
    "codex": ("exec_command", "cmd"),
    "claude_code": ("Bash", "command"),
}
MINI_DONE = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def patch_command(patch: str) -> str:
    """A shell command that applies ``patch`` in the workspace."""
    return f"git apply --whitespace=nowarn <<'POLAR_PATCH'\n{patch}POLAR_PATCH"


def solving_script(harness: str, command: str) -> dict[str, Any]:
    """One session's script: run ``command`` with the CLI's shell tool, then stop."""
    tool, argument = SHELL_TOOLS[harness]
    last: dict[str, Any] = (
        {"tool_calls": [{"name": tool, "arguments": {argument: MINI_DONE}}]}
        if harness == "mini_swe_agent"
        else {"text": "Done: the fix is applied."}
    )
    script: dict[str, Any] = {
        "turns": [
            {
                "reasoning": "I will apply the fix with the shell.",
                "tool_calls": [{"name": tool, "arguments": {argument: command}}],
            },
            last,
        ]
    }
    if harness == "opencode":
        script["side"] = [
            {"when": {"prompt_contains": "You are a title generator"}, "text": "Fixing"}
        ]
    return script


def group_script(harness: str, task_id: str, correct: list[bool]) -> dict[str, Any]:
    """Per-session scripts: the right fix where ``correct``, a wrong one elsewhere."""
    return {
        "sessions": [
            solving_script(
                harness, patch_command(solution_patch(task_id) if ok else wrong_patch(task_id))
            )
            for ok in correct
        ]
    }


class RolloutStack:
    def __init__(
        self,
        root: Path,
        tokenizer: Any,
        script: dict[str, Any] | None,
        *,
        node: dict[str, Any] | None = None,
        server: dict[str, Any] | None = None,
        token_delay_s: float = 0.0,
        engine: dict[str, Any] | None = None,
    ) -> None:
        """``engine``: the gateway's engine section for an engine already serving
        (then ``script`` is None and no scripted engine starts)."""
        self.root = root
        self.engine: Any = None
        if engine is None:
            assert script is not None
            self.engine = ScriptedEngine(
                script_from_dict(script), tokenizer, token_delay_s=token_delay_s
            ).start()
            engine = {
                "kind": "vllm",
                "base_url": self.engine.url,
                "model": "scripted",
                "retry_backoff_s": 0.01,
            }
        self._threads: list[ServerThread | NodeThread] = []
        self.server_config = ServerConfig.model_validate(
            {
                "port": 0,
                "db": str(root / "rollout.db"),
                "control_token": CONTROL_TOKEN,
                "node_timeout_s": 5.0,
                **(server or {}),
            }
        )
        self.start_server()
        self.node_config = NodeConfig.model_validate(
            {
                # Unique: a node id is leased machine-wide (another test run may hold one).
                "node_id": f"node-a-{uuid.uuid4().hex[:8]}",
                "server_url": self.url,
                "control_token": CONTROL_TOKEN,
                "heartbeat_interval_s": 0.5,
                "result_retry_s": 0.2,
                "sessions_dir": str(root / "sessions"),
                "files_dir": str(root / "node-files"),
                "harness_cache": str(HARNESS_CACHE),
                "keep_sessions": "always",
                "gateway": {
                    "port": 0,
                    "admin_token": CONTROL_TOKEN,
                    "capture": "token_in_token_out",
                    "engine": engine,
                    "store": {"path": str(root / "records.db")},
                },
                **(node or {}),
            }
        )
        self.start_node()

    def start_server(self) -> None:
        """Start (or restart, on the same port and database) the rollout server."""
        self.rollout = RolloutServer(self.server_config)
        thread = ServerThread(create_server_app(self.rollout), port=self.server_config.port)
        self.server_config = self.server_config.model_copy(update={"port": thread.port})
        self.rollout.public_url = thread.url
        self.server_thread = thread.start()
        self._threads.append(thread)
        self.url = thread.url

    def stop_server(self) -> None:
        self.server_thread.stop()
        self._threads.remove(self.server_thread)

    def start_node(self) -> None:
        self.service: NodeService = node_service(self.node_config)
        thread = NodeThread(self.service)
        self.node_thread = thread.start()
        self._threads.append(thread)

    def stop_node(self) -> None:
        self.node_thread.stop()
        self._threads.remove(self.node_thread)

    def client(self) -> RolloutClient:
        return RolloutClient(self.url, token=CONTROL_TOKEN)

    def close(self) -> None:
        for thread in reversed(self._threads):
            thread.stop()
        if self.engine is not None:
            self.engine.stop()


def write_serve_config(
    root: Path,
    *,
    port: int,
    engine: str,
    node_id: str | None = None,
    gateway_port: int = 0,
    heartbeat_s: float | None = None,
) -> Path:
    """``root/serve.yaml`` for ``polar serve -c``: a rollout server on ``port`` and one
    node whose gateway's engine is ``engine`` (a YAML flow mapping), every file under
    ``root``, the project's harness cache; free ports where none is given."""
    from polar.proxy.engines.vllm_process import free_port

    optional = "".join(
        [
            f"  node_id: {node_id}\n" if node_id else "",
            f"  heartbeat_interval_s: {heartbeat_s}\n" if heartbeat_s is not None else "",
        ]
    )
    path = root / "serve.yaml"
    path.write_text(
        f"""
server: {{port: {port}, db: {root / "rollout.db"}}}
node:
{optional}  control_port: {free_port()}
  sessions_dir: {root / "sessions"}
  files_dir: {root / "files"}
  harness_cache: {HARNESS_CACHE}
  gateway:
    port: {gateway_port or free_port()}
    engine: {engine}
    store: {{path: {root / "records.db"}}}
"""
    )
    return path
