"""A whole training set-up on one machine, in one process: the embedded engine
serving the policy, a rollout server, one gateway node in front of the engine
(token-in/token-out capture, sessions in the ``local`` runtime's sandboxes)
and the addresses and tokens a :class:`~polar.train.config.TrainConfig` needs.

``polar demo`` and ``benchmarks/learning.py`` run the reference trainer
against it; every part is the product's own (the same servers ``polar engine
serve``, ``polar serve`` and ``polar node`` start), only started in threads of
one process instead of three commands. The engine gets its own torch thread
count (on a small machine one thread each for the engine and the trainer
beats two threads fighting over two cores).
"""

from __future__ import annotations

import hashlib
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polar.harness.install import DEFAULT_CACHE_DIR


@dataclass(frozen=True, slots=True)
class LocalSettings:
    model: Path
    """The policy's Hugging Face model directory (its tokenizer renders prompts)."""
    root: Path
    """Where the run's stores, sessions and weights go (emptied first; the node,
    named after this path, reaps what a killed run here left)."""
    served_name: str = "policy"
    engine_threads: int = 1
    max_batch: int = 8
    run_slots: int = 4
    """Sessions whose agents run at once on the node (``capacity.run``)."""
    harness_cache: Path = DEFAULT_CACHE_DIR
    max_tokens: int | None = None
    """``engine.default_max_tokens``: the output limit of calls that ask for none."""
    limits: dict[str, Any] = field(default_factory=dict)
    """The node's sandbox ``limits`` (defaults: the node's)."""


@dataclass(frozen=True, slots=True)
class LocalStack:
    server_url: str
    gateway_url: str
    engine_url: str
    token: str
    """The rollout server's control token, also the gateway's admin token."""
    root: Path

    def weight_sync(self) -> dict[str, Any]:
        """``weight_sync`` of a :class:`~polar.train.config.TrainConfig` for this stack."""
        return {
            "gateways": [{"url": self.gateway_url, "admin_token": self.token}],
            "engines": [{"kind": "embedded", "url": self.engine_url}],
        }

    @property
    def records(self) -> Path:
        """The node gateway's record store (``polar records``, ``polar build``)."""
        return self.root / "records.db"


@contextmanager
def local_stack(settings: LocalSettings) -> Iterator[LocalStack]:
    """Start the engine, the rollout server and the node; stop them on exit."""
    from polar.proxy.engines.embedded import ModelRunner, create_engine_app
    from polar.rollout.config import NodeConfig, ServerConfig
    from polar.rollout.deploy import NodeThread, node_service
    from polar.rollout.server.app import create_server_app
    from polar.rollout.server.service import RolloutServer
    from polar.serverthread import ServerThread

    root = settings.root.resolve()
    # A fresh run, but the session directories are the node's to clean: it reaps
    # what a killed run in the same place left (mounts included) when it starts.
    if root.is_dir():
        for entry in root.iterdir():
            if entry.name != "sessions":
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    root.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(16)
    node_id = "local-" + hashlib.sha256(str(root).encode()).hexdigest()[:12]
    runner = ModelRunner(
        settings.model, max_batch=settings.max_batch, threads=settings.engine_threads
    )
    engine = ServerThread(create_engine_app(runner, served_name=settings.served_name)).start()
    server: Any = None
    node: Any = None
    try:
        rollout = RolloutServer(
            ServerConfig.model_validate(
                {"port": 0, "db": str(root / "rollout.db"), "control_token": token}
            )
        )
        server = ServerThread(create_server_app(rollout), port=0).start()
        rollout.public_url = server.url
        engine_config: dict[str, Any] = {
            "kind": "embedded",
            "base_url": engine.url,
            "model": settings.served_name,
        }
        if settings.max_tokens is not None:
            engine_config["default_max_tokens"] = settings.max_tokens
        node_config = NodeConfig.model_validate(
            {
                "node_id": node_id,
                "server_url": server.url,
                "control_token": token,
                "control_port": 0,
                "sessions_dir": str(root / "sessions"),
                "files_dir": str(root / "files"),
                "harness_cache": str(settings.harness_cache.resolve()),
                "keep_sessions": "never",
                "model": settings.served_name,
                "capacity": {
                    "run": settings.run_slots,
                    "ahead": settings.run_slots,
                    "prepare": 2,
                    "postrun": 2,
                },
                **({"limits": settings.limits} if settings.limits else {}),
                "gateway": {
                    "port": 0,
                    "admin_token": token,
                    "capture": "token_in_token_out",
                    "engine": engine_config,
                    "render": {"tokenizer": str(settings.model.resolve())},
                    "store": {"path": str(root / "records.db")},
                },
            }
        )
        node = NodeThread(node_service(node_config)).start()
        yield LocalStack(server.url, node.gateway_url, engine.url, token, root)
    finally:
        if node is not None:
            node.stop()
        if server is not None:
            server.stop()
        engine.stop()
        runner.close()
