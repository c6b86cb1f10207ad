"""Serving one ASGI app from a command, and saying so once it listens."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import typer


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
