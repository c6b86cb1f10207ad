"""One worker of a gateway group: a whole gateway on a Unix socket.

Started by :mod:`polar.proxy.workers.supervisor` as
``python -m polar.cli.gateway_worker INDEX COUNT SOCKET``.
"""

from __future__ import annotations

from polar.proxy.config import GatewayConfig
from polar.proxy.workers.affinity import WorkerSlot


def serve_worker(settings: GatewayConfig, slot: WorkerSlot, socket_path: str) -> None:
    import uvicorn

    from polar.gctune import tune_for_serving
    from polar.malloctune import pin_mmap_threshold
    from polar.proxy.app import create_app
    from polar.proxy.gateway import Gateway

    pin_mmap_threshold()
    app = create_app(Gateway(settings, worker=slot))
    tune_for_serving(settings.gc_young_threshold)
    uvicorn.run(
        app,
        uds=socket_path,
        log_level=settings.log_level,
        loop="uvloop",
        http="httptools",
        access_log=False,
        timeout_keep_alive=settings.keepalive_s,
    )
