"""One-line CLI failures: ``polar <command>: error: <message>`` and a non-zero exit."""

from __future__ import annotations

import sys
from typing import NoReturn

import typer


def fail(command: str, message: str, *, code: int = 2) -> NoReturn:
    print(f"polar {command}: error: {message}", file=sys.stderr)
    raise typer.Exit(code)


def configure_logging(level: str) -> None:
    """Log to stderr at ``level``. httpx logs every request it makes at INFO (a node's
    heartbeat every few seconds): those lines show only at ``debug``."""
    import logging

    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if level.upper() != "DEBUG":
        logging.getLogger("httpx").setLevel(logging.WARNING)
