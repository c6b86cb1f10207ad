"""Assembling the rollout service's processes: a gateway node (its gateway on
one port, its API on another), the rollout server, or both in one process
(``polar serve``)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import uvicorn
from starlette.applications import Starlette

from polar.gctune import tune_for_serving
from polar.proxy.app import create_app
from polar.proxy.front.asgi import Router
from polar.proxy.front.httpwire import GatewayHttpProtocol
from polar.proxy.gateway import Gateway
from polar.rollout.config import NodeConfig, ServerConfig
from polar.rollout.node.app import create_node_app, node_extension
from polar.rollout.node.lifecycle import RuntimeFactory
from polar.rollout.node.service import Node, check_node, claim_node
from polar.rollout.raynodes import RayConfig
from polar.rollout.server.app import create_server_app
from polar.rollout.server.service import RolloutServer
from polar.runtime.base import GatewayAddress
from polar.runtime.lease import Lease
from polar.runtime.registry import create_runtime
from polar.trajectory import BuildConfig, TurnFormat

_log = logging.getLogger(__name__)


def build_config_for(tokenizer_dir: Path | None) -> BuildConfig:
    """Trajectory building for the model whose tokenizer the gateway renders with."""
    from polar.proxy.render.tokens import TokenText
    from polar.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_dir)
    return BuildConfig(
        turns=TurnFormat.from_tokenizer(tokenizer), decode=TokenText(tokenizer).decode
    )


@dataclass(slots=True)
class NodeService:
    """A node's two ASGI apps: ``app`` (the gateway; sandboxes reach its model
    routes through their relay) and ``control_app`` (the node's API, for the
    rollout server). ``bind`` and ``bind_control`` tell them their ports."""

    config: NodeConfig
    gateway: Gateway
    node: Node
    app: Router
    control_app: Starlette
    address: list[GatewayAddress] = field(default_factory=list)

    def bind(self, host: str, port: int) -> None:
        """Where the gateway listens (before it starts): the sandbox relay connects there."""
        self.address[:] = [GatewayAddress(_reachable(host), port)]
        if self.config.public_gateway_url is None:
            self.node.gateway_url = f"http://{_reachable(host)}:{port}"

    def bind_control(self, host: str, port: int) -> None:
        """Where the node's API listens: the URL the node registers with."""
        if self.config.public_url is None:
            self.node.url = f"http://{_reachable(host)}:{port}"


def _reachable(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def node_service(
    config: NodeConfig,
    *,
    runtime_factory: RuntimeFactory = create_runtime,
    build: BuildConfig | None = None,
    leases: list[Lease] | None = None,
) -> NodeService:
    """``leases``: the node's leases, already taken
    (:func:`~polar.rollout.node.service.claim_node`)."""
    gateway = Gateway(config.gateway)
    node = Node(
        config,
        gateway,
        build or build_config_for(config.gateway.render.tokenizer),
        runtime_factory=runtime_factory,
        leases=leases,
    )
    address: list[GatewayAddress] = []

    def where() -> GatewayAddress:
        if not address:
            raise RuntimeError("NodeService.bind was not called before the app started")
        return address[0]

    app = create_app(gateway, extensions=[node_extension(node, where)])
    service = NodeService(config, gateway, node, app, create_node_app(node), address)
    service.bind(config.gateway.host, config.gateway.port)
    return service


def listening_socket(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    return sock


def _uvicorn(
    app: Any, log_level: str, keepalive_s: int = 5, *, gateway: bool = False
) -> uvicorn.Server:
    """``gateway``: served as ``polar gateway`` serves it (:mod:`polar.proxy.front.httpwire`:
    writes of a loop turn coalesced, heads over its limit answered 431)."""
    return uvicorn.Server(
        uvicorn.Config(
            app,
            log_level=log_level,
            lifespan="on",
            loop="asyncio",
            access_log=False,
            timeout_graceful_shutdown=5,
            timeout_keep_alive=keepalive_s,
            http=GatewayHttpProtocol if gateway else "auto",
        )
    )


@dataclass(frozen=True, slots=True)
class Listening:
    """Where :func:`serve`'s servers listen, once all of them have started."""

    server_url: str | None = None
    """The rollout server's API."""
    gateway_url: str | None = None
    """The node's gateway (what sandboxes' harnesses call, through their relay)."""
    node_url: str | None = None
    """The node's API (what the rollout server calls)."""
    node_id: str | None = None


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{_reachable(host)}:{port}"


async def serve(
    server_config: ServerConfig | None,
    node_config: NodeConfig | None,
    log_level: str = "info",
    *,
    ray: RayConfig | None = None,
    on_ready: Callable[[Listening], None] | None = None,
) -> None:
    """Run a rollout server, a node, or both in this process until interrupted; with
    ``ray``, the server here and ``ray.nodes`` nodes as Ray actors (``node_config`` is
    their template; see :mod:`polar.rollout.raynodes`). ``on_ready`` is called once,
    when every server here has started (after their start-up, before Ray places nodes)."""
    servers: list[tuple[uvicorn.Server, socket.socket]] = []
    extra: list[asyncio.Task[None]] = []
    ray_nodes = None
    listening = Listening()
    if server_config is not None:
        sock = listening_socket(server_config.host, server_config.port)
        listening = dataclasses.replace(listening, server_url=_url(sock))
        rollout = RolloutServer(server_config)
        servers.append((_uvicorn(create_server_app(rollout), log_level), sock))
        if ray is not None and node_config is not None:
            from polar.rollout.raynodes import RayNodes

            host, port = sock.getsockname()[:2]
            url = ray.server_url or f"http://{_reachable(host)}:{port}"
            template = node_config.model_copy(update={"server_url": url})
            ray_nodes = RayNodes(ray, template, rollout.node_died)
            node_config = None
    if node_config is not None:
        check_node(node_config)
        # Refused here, in one line, if a live node has its id or directories.
        service = node_service(node_config, leases=claim_node(node_config))
        sock = listening_socket(node_config.gateway.host, node_config.gateway.port)
        control = listening_socket(node_config.control_host, node_config.control_port)
        service.bind(*sock.getsockname()[:2])
        service.bind_control(*control.getsockname()[:2])
        listening = dataclasses.replace(
            listening,
            gateway_url=_url(sock),
            node_url=service.node.url,
            node_id=node_config.node_id,
        )
        # The API first: its server is up before the gateway's start-up starts the node.
        servers.append((_uvicorn(service.control_app, log_level), control))
        servers.append(
            (_uvicorn(service.app, log_level, node_config.gateway.keepalive_s, gateway=True), sock)
        )
        tune_for_serving(node_config.gateway.gc_young_threshold)
    elif server_config is not None:
        tune_for_serving()
    tasks = [asyncio.ensure_future(server.serve(sockets=[sock])) for server, sock in servers]
    if on_ready is not None:
        extra.append(asyncio.ensure_future(_when_started(servers, listening, on_ready)))
    if ray_nodes is not None:
        placed = await asyncio.to_thread(ray_nodes.start)
        for node in placed:
            _log.info("node %s on Ray node %s at %s", node.node_id, node.ray_node, node.control_url)
        extra.append(asyncio.ensure_future(ray_nodes.watch()))
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()
    finally:
        for task in extra:
            task.cancel()
        if ray_nodes is not None:
            await asyncio.to_thread(ray_nodes.stop)
        for server, _ in servers:
            server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.gather(*tasks, *extra, return_exceptions=True)


async def _when_started(
    servers: list[tuple[uvicorn.Server, socket.socket]],
    listening: Listening,
    on_ready: Callable[[Listening], None],
) -> None:
    # uvicorn's servers say they started only by a flag: poll it.
    while True:
        if all(server.started for server, _ in servers):
            on_ready(listening)
            return
        await asyncio.sleep(0.05)


class NodeThread:
    """A node's two servers (gateway, API) on one event loop in a background thread,
    as :func:`serve` runs them (the API's handlers use the node, which lives on
    the gateway's loop): for tests and in-process services. Free ports on ``host``."""

    def __init__(self, service: NodeService, host: str = "127.0.0.1") -> None:
        self._sockets = [listening_socket(host, 0), listening_socket(host, 0)]
        gateway, control = (sock.getsockname()[:2] for sock in self._sockets)
        service.bind(*gateway)
        service.bind_control(*control)
        self.gateway_url = f"http://{gateway[0]}:{gateway[1]}"
        self.control_url = f"http://{control[0]}:{control[1]}"
        protocols: tuple[tuple[Any, type[asyncio.Protocol] | Literal["auto"]], ...] = (
            (service.app, GatewayHttpProtocol),  # as polar gateway serves it
            (service.control_app, "auto"),
        )
        self._servers = [
            uvicorn.Server(
                uvicorn.Config(app, log_level="warning", lifespan="on", loop="asyncio", http=http)
            )
            for app, http in protocols
        ]
        self._thread = threading.Thread(target=self._run, name="node", daemon=True)
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        """The gateway's URL (what harnesses and engine clients call)."""
        return self.gateway_url

    def _run(self) -> None:
        async def both() -> None:
            await asyncio.gather(
                *(
                    server.serve(sockets=[sock])
                    for server, sock in zip(self._servers, self._sockets, strict=True)
                )
            )

        try:
            asyncio.run(both())
        except BaseException as exc:
            self._error = exc

    def start(self, timeout_s: float = 60.0) -> NodeThread:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not all(server.started for server in self._servers):
            if not self._thread.is_alive():
                raise RuntimeError(f"the node failed to start: {self._error!r}")
            if time.monotonic() > deadline:
                raise TimeoutError("the node did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.should_exit = True
        self._thread.join(timeout=60)
        for sock in self._sockets:
            sock.close()
