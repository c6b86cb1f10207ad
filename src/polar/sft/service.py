"""A rollout service inside the generator's process, for ``polar generate``
without ``--server-url``: a rollout server and one gateway node, each a real
HTTP server on its own thread, as ``polar serve`` runs them.

Its state (the rollout database, the gateway's records, session directories)
lives in ``<out>/service`` and is cleared at every start: whatever a killed
generator left running died with it, and the journal, not this service,
remembers what was acknowledged. Sandboxes die with the process (bubblewrap's
``--die-with-parent``).
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from polar.rollout.config import NodeConfig, ServerConfig
from polar.rollout.deploy import node_service
from polar.rollout.server import RolloutServer, create_server_app
from polar.serverthread import ServerThread


@dataclass(frozen=True, slots=True)
class ServiceAddress:
    url: str
    token: str | None


def service_configs(
    server: ServerConfig, node: NodeConfig, state: Path
) -> tuple[ServerConfig, NodeConfig]:
    """The configs with their state under ``state``, free ports, and a shared control token."""
    token = server.control_token or node.control_token or secrets.token_urlsafe(24)
    server = server.model_copy(
        update={"db": state / "rollout.db", "port": 0, "control_token": token}
    )
    gateway = node.gateway.model_copy(
        update={
            "port": 0,
            "store": node.gateway.store.model_copy(update={"path": state / "records.db"}),
        }
    )
    node = node.model_copy(
        update={"gateway": gateway, "sessions_dir": state / "sessions", "control_token": token}
    )
    return server, node


@contextlib.contextmanager
def local_service(server: ServerConfig, node: NodeConfig, state: Path) -> Iterator[ServiceAddress]:
    """Start a rollout server and a node (state cleared first); stop both on exit."""
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(parents=True)
    server, node = service_configs(server, node, state)
    with contextlib.ExitStack() as stack:
        rollout = RolloutServer(server)
        server_thread = ServerThread(create_server_app(rollout), host=server.host)
        rollout.public_url = server_thread.url
        stack.enter_context(server_thread)
        node = node.model_copy(update={"server_url": server_thread.url})
        service = node_service(node)
        node_thread = ServerThread(service.app, host=node.gateway.host)
        service.bind(node_thread.host, node_thread.port)
        stack.enter_context(node_thread)
        yield ServiceAddress(server_thread.url, server.control_token)
