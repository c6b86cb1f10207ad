"""Gateway nodes as Ray actors, placed across a Ray cluster by resources.

An optional backend (``pip install 'polar[ray]'``; nothing else imports Ray). The rollout
server stays where ``polar serve --backend ray`` runs; each gateway node becomes one actor
(:class:`NodeActor`) on a machine of the cluster that has the resources the ``ray:``
section asks for (CPUs, memory, and a custom ``sandbox`` resource that operators put on
the machines allowed to run sandboxes), spread over machines. Inside its actor a node is
the same node as ever: its gateway and API on that machine's address, registering with
the rollout server over HTTP, fetching task files from it (:mod:`polar.rollout.files`).

What Ray adds is knowing when a node is gone: :class:`RayNodes` pings every actor, and an
actor Ray reports dead (its machine lost, its process killed) is declared lost at once
(``RolloutServer.node_died``): its sessions end ERROR naming the node and Ray's reason,
and are resampled on the surviving nodes where the task allows. A dead node is not
restarted (its sandboxes and sessions died with it); the group goes on without it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from polar.rollout.config import NodeConfig

_log = logging.getLogger(__name__)


class RayConfig(BaseModel):
    """``polar serve --backend ray``'s ``ray:`` section."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    address: str | None = None
    """The Ray cluster to join (``ray.init(address=...)``); None: ``auto`` (the cluster
    this machine is part of, as ``ray start`` set it up)."""
    nodes: int = Field(default=1, ge=1, le=4096)
    """Gateway-node actors to place."""
    num_cpus: float = Field(default=1.0, ge=0)
    """CPUs each node actor reserves (its sessions' sandboxes run beside it)."""
    memory_mb: int | None = Field(default=None, ge=1)
    """Memory each node actor reserves, if any."""
    sandbox: float = Field(default=1.0, ge=0)
    """Units of the custom ``sandbox`` resource each node actor needs (0: none)."""
    server_url: str | None = None
    """How node actors reach the rollout server (default: the server's host and port)."""
    ping_interval_s: float = Field(default=2.0, gt=0)
    start_timeout_s: float = Field(default=300.0, gt=0)


@dataclass(frozen=True, slots=True)
class PlacedNode:
    node_id: str
    control_url: str
    gateway_url: str
    ray_node: str
    """The Ray node (machine) the actor runs on."""


def node_config_for(template: NodeConfig, index: int, host: str) -> NodeConfig:
    """The config of node actor ``index``: its own id (``<node_id>-<index>``), its own
    directories and record store (under the template's, named by that id), and ports
    on ``host`` chosen when it starts."""
    node_id = f"{template.node_id}-{index}"
    store = template.gateway.store
    gateway = template.gateway.model_copy(
        update={
            "host": host,
            "port": 0,
            "store": store.model_copy(
                update={"path": store.path.parent / node_id / store.path.name}
            ),
        }
    )
    return template.model_copy(
        update={
            "node_id": node_id,
            "control_host": host,
            "control_port": 0,
            "public_url": None,
            "gateway": gateway,
            "sessions_dir": template.sessions_dir / node_id,
            "files_dir": template.files_dir / node_id,
        }
    )


class NodeActor:
    """One gateway node in a Ray actor (wrapped by ``ray.remote`` in :class:`RayNodes`)."""

    def __init__(self, template: str, index: int) -> None:
        import ray

        from polar.rollout.deploy import NodeThread, node_service
        from polar.rollout.node.service import check_node

        host: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        config = node_config_for(NodeConfig.model_validate_json(template), index, host)
        check_node(config)
        self._thread = NodeThread(node_service(config), host=host).start()
        self._placed = PlacedNode(
            node_id=config.node_id,
            control_url=self._thread.control_url,
            gateway_url=self._thread.gateway_url,
            ray_node=ray.get_runtime_context().get_node_id(),
        )

    def placed(self) -> PlacedNode:
        return self._placed

    def ping(self) -> bool:
        return True

    def stop(self) -> None:
        self._thread.stop()


class RayNodes:
    """Places the node actors, watches them, and reports the dead (see the module docstring).

    ``on_died(node_id, reason)`` is called on the event loop that runs :meth:`watch`.
    """

    def __init__(
        self, config: RayConfig, template: NodeConfig, on_died: Callable[[str, str], None]
    ) -> None:
        self.config = config
        self._template = template
        self._on_died = on_died
        self._actors: dict[str, Any] = {}
        self.placed: list[PlacedNode] = []

    def start(self) -> list[PlacedNode]:
        """Join the cluster and start every node actor; blocks until all serve."""
        import ray

        if not ray.is_initialized():
            ray.init(
                address=self.config.address or "auto",
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
        resources = {"sandbox": self.config.sandbox} if self.config.sandbox else {}
        options: dict[str, Any] = {
            "num_cpus": self.config.num_cpus,
            "resources": resources,
            "scheduling_strategy": "SPREAD",
            "max_restarts": 0,
        }
        if self.config.memory_mb is not None:
            options["memory"] = self.config.memory_mb * 2**20
        remote: Any = ray.remote(NodeActor).options(**options)
        template = self._template.model_dump_json(exclude_unset=True)
        actors: list[Any] = [remote.remote(template, i) for i in range(self.config.nodes)]
        self.placed = ray.get(
            [actor.placed.remote() for actor in actors], timeout=self.config.start_timeout_s
        )
        self._actors = {p.node_id: a for p, a in zip(self.placed, actors, strict=True)}
        return self.placed

    async def watch(self) -> None:
        """Ping every live actor each ``ping_interval_s``; report the ones Ray says died."""
        import ray
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

        while self._actors:
            await asyncio.sleep(self.config.ping_interval_s)
            for node_id, actor in list(self._actors.items()):
                try:
                    await asyncio.to_thread(ray.get, actor.ping.remote(), timeout=30)
                except ActorUnavailableError:
                    continue  # restarting or unreachable for now: asked again next round
                except (ActorDiedError, RayActorError) as exc:
                    del self._actors[node_id]
                    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                    _log.warning("node %s died (Ray): %s", node_id, reason)
                    self._on_died(node_id, f"Ray reports its actor died: {reason}")
                except ray.exceptions.GetTimeoutError:
                    continue  # busy: the server's heartbeat timeout still applies

    def stop(self) -> None:
        import ray

        for actor in self._actors.values():
            try:
                ray.get(actor.stop.remote(), timeout=60)
            except Exception as exc:  # already gone: nothing left to stop
                _log.info("node actor stop: %s", exc)
            ray.kill(actor)
        self._actors.clear()
