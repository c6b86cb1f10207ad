"""Listening from a command: the ports tried before anything loads, then the app
served with one ready line once it listens.

A server that loads for seconds (a model, a tokenizer, the gateway) and then
finds its port taken wastes the wait and ends in the web server's own message;
the commands that listen try each address first, with the options a server
binds with (``SO_REUSEADDR``: a port left in ``TIME_WAIT`` is free, one with a
listener is not), and fail in one line naming the port and what sets it. The
port is released again at once: another process may still take it in between,
and the server then reports that itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from dataclasses import dataclass
from typing import Any

import typer

from polar.cli.errors import fail


@dataclass(frozen=True, slots=True)
class Listen:
    """An address a command will listen on, and the flag or field that sets it."""

    host: str
    port: int
    setting: str


def check_ports(command: str, *addresses: Listen) -> None:
    """Fail ``polar <command>`` in one line if one of ``addresses`` cannot be bound."""
    for address in addresses:
        if address.port == 0:  # any free port
            continue
        problem = _bind_problem(address.host, address.port)
        if problem is not None:
            fail(
                command,
                f"cannot listen on {address.host}:{address.port} ({problem}); "
                f"choose another port with {address.setting}",
            )


def _bind_problem(host: str, port: int) -> str | None:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"unknown host: {exc.strerror}"
    family, kind, proto, _, where = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(where)
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def serve_app(command: str, app: Any, host: str, port: int, ready: str) -> None:
    """Serve ``app`` on ``host:port`` until interrupted. Once it listens, one line on
    stderr: ``polar COMMAND: ready: READY``, ``{url}`` in ``ready`` replaced by the URL
    clients use (``http://127.0.0.1:PORT/`` for a wildcard host)."""
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
    )
    shown = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    url = f"http://{shown}:{port}/"

    async def run() -> None:
        serving = asyncio.ensure_future(server.serve())
        while not server.started:
            if serving.done():
                break
            await asyncio.sleep(0.05)
        else:
            typer.echo(f"polar {command}: ready: {ready.format(url=url)}", err=True)
        await serving

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
