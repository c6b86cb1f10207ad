"""Entry point of one worker process of ``polar gateway --workers N``.

``python -m polar.cli.gateway_worker INDEX COUNT SOCKET``, with the group's
configuration as JSON on standard input (it carries the admin token, so it is
not put on the command line). Only :mod:`polar.proxy.workers.supervisor` starts it.
"""

from __future__ import annotations

import sys

from polar.cli.errors import configure_logging, fail
from polar.configfile import ConfigError
from polar.proxy.config import GatewayConfig
from polar.proxy.workers.affinity import WorkerSlot
from polar.proxy.workers.worker import serve_worker


def main(argv: list[str]) -> None:
    index, count, socket_path = int(argv[0]), int(argv[1]), argv[2]
    settings = GatewayConfig.model_validate_json(sys.stdin.buffer.read())
    configure_logging(settings.log_level)
    try:
        serve_worker(settings, WorkerSlot(index, count), socket_path)
    except ConfigError as exc:
        fail("gateway", f"worker {index}: {exc}")


if __name__ == "__main__":
    import typer

    try:
        main(sys.argv[1:])
    except typer.Exit as exit_:
        sys.exit(exit_.exit_code)
