"""The rollout server's node registry: which nodes there are, and whether they answer.

A node registers (its URL, its capacity and, when it says how a trainer reaches
it, its gateway with that gateway's admin token), then beats. Each is kept here
in memory and in the store (:meth:`~polar.rollout.server.store.RolloutStore.save_node`:
the registration, whether it drains, when it was last heard from), all but the
gateway's admin token, which stays in memory: a node that is back registers
again and sends it again. So a restarted server knows its nodes at once,
counting their silence from before the restart, and lists their gateways once
they have registered again.

A node is **healthy** while its heartbeats arrive within ``node_timeout_s``:
what dispatch needs (a harness that makes no model call runs without an
engine); whether its engine answers is reported apart (``engine_error``). A
node silent for twice that is forgotten; what then happens to its sessions is
the dispatcher's (:mod:`polar.rollout.server.dispatch`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from polar.rollout.protocol import EventKind, GatewayAccess, NodeRegistration, NodeView
from polar.rollout.server.errors import NodeUnknown
from polar.rollout.server.events import EventHub
from polar.rollout.server.store import RolloutStore


@dataclass(slots=True)
class NodeState:
    registration: NodeRegistration
    last_seen: float = field(default_factory=time.monotonic)
    draining: bool = False
    engine_error: str | None = None

    @property
    def id(self) -> str:
        return self.registration.node_id


class NodeRegistry:
    def __init__(self, store: RolloutStore, events: EventHub, node_timeout_s: float) -> None:
        self._store = store
        self._events = events
        self._timeout_s = node_timeout_s
        self._nodes: dict[str, NodeState] = {}

    def recover(self) -> None:
        """Know again the nodes the store lists (after a restart), silent since they
        were last heard from."""
        now, wall = time.monotonic(), time.time()
        for row in self._store.nodes():
            self._nodes[row.registration.node_id] = NodeState(
                row.registration,
                last_seen=now - max(0.0, wall - row.last_seen),
                draining=row.draining,
            )

    def __iter__(self) -> Iterator[NodeState]:
        return iter(list(self._nodes.values()))

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._nodes

    def get(self, node_id: str) -> NodeState | None:
        return self._nodes.get(node_id)

    def known(self, node_id: str) -> NodeState:
        node = self._nodes.get(node_id)
        if node is None:
            raise NodeUnknown(node_id)
        return node

    # ---------------------------------------------------------------- changes

    def register(self, registration: NodeRegistration) -> None:
        """Know the node (again): its drain is kept, its silence starts now."""
        old = self._nodes.get(registration.node_id)
        draining = old.draining if old else False
        self._store.save_node(registration, draining=draining)
        self._nodes[registration.node_id] = NodeState(registration, draining=draining)
        self._events.publish(
            EventKind.NODE_REGISTERED, node_id=registration.node_id, url=registration.url
        )

    def beat(self, node_id: str, engine_error: str | None) -> NodeState:
        """The node was heard from, its engine answering or not (``engine_error``)."""
        node = self.known(node_id)
        node.last_seen = time.monotonic()
        node.engine_error = engine_error  # the node logs the change
        self._store.node_seen(node_id)
        return node

    def drain(self, node_id: str, draining: bool) -> NodeState:
        node = self.known(node_id)
        self._store.set_draining(node_id, draining)
        node.draining = draining
        return node

    def unreachable(self, node: NodeState) -> None:
        """The node did not answer a call: unhealthy now, until it beats again."""
        node.last_seen = time.monotonic() - self._timeout_s

    def forget(self, node_id: str) -> None:
        """A node declared lost: out of memory and of the store, announced."""
        if self._nodes.pop(node_id, None) is not None:
            self._store.drop_node(node_id)
            self._events.publish(EventKind.NODE_LOST, node_id=node_id)

    def expire(self) -> None:
        """Forget every node silent for twice ``node_timeout_s``."""
        now = time.monotonic()
        for node in list(self._nodes.values()):
            if now - node.last_seen > 2 * self._timeout_s:
                self.forget(node.id)

    # ---------------------------------------------------------------- reading

    def healthy(self, node: NodeState) -> bool:
        """The node answers its heartbeats (what dispatch needs: a harness that makes no
        model call runs without an engine; whether the engine answers is reported apart)."""
        return time.monotonic() - node.last_seen < self._timeout_s

    def active(self) -> dict[str, int]:
        """How many sessions each node holds (dispatched and not ended)."""
        counts: dict[str, int] = {}
        for session in self._store.in_flight():
            if session.node_id is not None:
                counts[session.node_id] = counts.get(session.node_id, 0) + 1
        return counts

    def view(self, node: NodeState, active: dict[str, int] | None = None) -> NodeView:
        held = (self.active() if active is None else active).get(node.id, 0)
        return NodeView(
            node_id=node.id,
            url=node.registration.url,
            capacity=node.registration.capacity,
            healthy=self.healthy(node) and node.engine_error is None,
            draining=node.draining,
            active=held,
            last_seen=round(time.monotonic() - node.last_seen, 3),
            engine_error=node.engine_error,
        )

    def views(self) -> list[NodeView]:
        active = self.active()
        return [self.view(node, active) for node in self]

    def gateways(self) -> list[GatewayAccess]:
        """Every registered node's gateway that said how a trainer reaches it."""
        return [node.registration.gateway for node in self if node.registration.gateway is not None]
