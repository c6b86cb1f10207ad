"""A port a command would listen on, tried before anything loads.

A server that loads for seconds (a model, a tokenizer, the gateway) and then
finds its port taken wastes the wait and ends in the web server's own message;
the commands that listen try each address first, with the options a server
binds with (``SO_REUSEADDR``: a port left in ``TIME_WAIT`` is free, one with a
listener is not), and fail in one line naming the port and what sets it. The
port is released again at once: another process may still take it in between,
and the server then reports that itself.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

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
