"""The rollout server's node registry (:mod:`polar.rollout.server.nodes`) over a real store:
what it keeps across a restart and what only in memory, when a node stops counting
as healthy, and when it is forgotten."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from polar.rollout.protocol import GatewayAccess, NodeRegistration
from polar.rollout.server.errors import NodeUnknown
from polar.rollout.server.events import EventHub
from polar.rollout.server.nodes import NodeRegistry
from polar.rollout.server.store import RolloutStore

ADMIN_TOKEN = "admin-token-0123456789"


def registration(node_id: str, *, gateway: bool = False) -> NodeRegistration:
    access = GatewayAccess(node_id=node_id, url="http://10.0.0.7:8000", admin_token=ADMIN_TOKEN)
    return NodeRegistration(
        node_id=node_id, url="http://10.0.0.7:8301", gateway=access if gateway else None
    )


def test_a_restarted_registry_knows_its_nodes_and_drains_but_not_their_gateways(
    tmp_path: Path,
) -> None:
    store = RolloutStore(tmp_path / "rollout.db")
    nodes = NodeRegistry(store, EventHub(), node_timeout_s=30)
    nodes.register(registration("a", gateway=True))
    nodes.register(registration("b"))
    nodes.drain("b", True)
    assert [gateway.node_id for gateway in nodes.gateways()] == ["a"]

    again = NodeRegistry(store, EventHub(), node_timeout_s=30)
    again.recover()
    assert [(view.node_id, view.draining, view.healthy) for view in again.views()] == [
        ("a", False, True),
        ("b", True, True),
    ]
    assert again.gateways() == []  # the admin token was never stored
    again.register(registration("b"))  # back: its drain is kept
    assert again.known("b").draining
    store.close()


def test_a_silent_node_is_unhealthy_then_forgotten(tmp_path: Path) -> None:
    store = RolloutStore(tmp_path / "rollout.db")
    nodes = NodeRegistry(store, EventHub(), node_timeout_s=1.0)
    nodes.register(registration("quiet"))
    node = nodes.known("quiet")
    nodes.unreachable(node)
    assert not nodes.healthy(node)
    nodes.expire()
    assert "quiet" in nodes  # silent for one timeout only
    nodes.beat("quiet", engine_error="connection refused")
    assert nodes.healthy(node)
    assert not nodes.view(node).healthy  # its engine does not answer
    node.last_seen = time.monotonic() - 2.5
    nodes.expire()
    assert "quiet" not in nodes and store.nodes() == []
    with pytest.raises(NodeUnknown, match="node quiet is not registered"):
        nodes.beat("quiet", engine_error=None)
    store.close()
