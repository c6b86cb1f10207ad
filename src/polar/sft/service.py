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

import asyncio
import contextlib
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from polar.rollout.config import NodeConfig, ServerConfig
from polar.rollout.deploy import NodeThread, node_service
from polar.rollout.node.service import claim_node
from polar.rollout.server.app import create_server_app
from polar.rollout.server.service import RolloutServer
from polar.runtime.reap import reap
from polar.serverthread import ServerThread


@dataclass(frozen=True, slots=True)
class ServiceAddress:
    url: str
    token: str | None


def service_configs(
    server: ServerConfig, node: NodeConfig, state: Path
) -> tuple[ServerConfig, NodeConfig]:
    """The configs with their state under ``state``, free ports, and the server's
    control token shared with the node."""
    token = server.control_token or node.control_token
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
        update={
            "gateway": gateway,
            "sessions_dir": state / "sessions",
            "files_dir": state / "files",
            "control_token": token,
            "control_port": 0,
        }
    )
    return server, node


@contextlib.contextmanager
def local_service(server: ServerConfig, node: NodeConfig, state: Path) -> Iterator[ServiceAddress]:
    """Start a rollout server and a node (state cleared first); stop both on exit."""
    server, node = service_configs(server, node, state)
    # A killed generator's node may have left mounted session directories (and
    # containers, cgroups): release them, or the state cannot be cleared; only
    # under the node's leases (a live node with this id or state is refused).
    leases = claim_node(node)
    try:
        asyncio.run(reap(node.node_id, sessions_dir=node.sessions_dir))
        shutil.rmtree(state, ignore_errors=True)
        state.mkdir(parents=True, exist_ok=True)
    except BaseException:
        for lease in leases:
            lease.release()
        raise
    with contextlib.ExitStack() as stack:
        for lease in leases:  # released by the node when it stops; else here
            stack.callback(lease.release)
        rollout = RolloutServer(server)
        server_thread = ServerThread(create_server_app(rollout), host=server.host)
        rollout.public_url = server_thread.url
        stack.enter_context(server_thread)
        node = node.model_copy(update={"server_url": server_thread.url})
        service = node_service(node, leases=leases)
        node_thread = NodeThread(service, host=node.gateway.host).start()
        stack.callback(node_thread.stop)
        yield ServiceAddress(server_thread.url, server.control_token)
