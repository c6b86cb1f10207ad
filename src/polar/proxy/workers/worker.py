"""One worker of a gateway group: a whole gateway on a Unix socket.

Started by :mod:`polar.proxy.workers.supervisor` as
``python -m polar.cli.gateway_worker INDEX COUNT SOCKET``.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from polar.proxy.config import GatewayConfig
from polar.proxy.workers.affinity import WorkerSlot


def serve_worker(settings: GatewayConfig, slot: WorkerSlot, socket_path: str) -> None:
    from polar.gctune import tune_for_serving
    from polar.malloctune import pin_mmap_threshold
    from polar.proxy.app import create_app
    from polar.proxy.front.httpwire import run_server
    from polar.proxy.gateway import Gateway

    _exit_with_parent()
    pin_mmap_threshold()
    app = create_app(Gateway(settings, worker=slot))
    tune_for_serving(settings.gc_young_threshold)
    run_server(app, uds=socket_path, log_level=settings.log_level, keepalive_s=settings.keepalive_s)


def _exit_with_parent() -> None:
    """Stop (as on SIGTERM: calls finish, the store closes) once the parent is
    gone, so a killed group leaves no worker behind."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
