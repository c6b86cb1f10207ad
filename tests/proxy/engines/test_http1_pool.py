"""The gateway's engine connection pool and idle connections the engine closes.

Engines close idle keep-alive connections themselves (vLLM and SGLang after
5 s); a request sent on one as it closes is lost. Under load that happened to
a call on every attempt (a 502). The server here is a raw asyncio HTTP/1.1
server, so the test controls exactly when a connection dies.
"""

from __future__ import annotations

import asyncio

import pytest

from polar.proxy.engines.http1 import ConnectionLost, Http1Pool
from polar.proxy.engines.transport import EngineTransport
from polar.proxy.errors import EngineUnavailable


class Engine:
    """Answers ``{}``; with ``one_shot``, a second request on a connection gets it
    closed without a reply (the engine's keep-alive timer fired as it arrived)."""

    def __init__(self, one_shot: bool) -> None:
        self.one_shot = one_shot
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                await reader.readexactly(length)
                if self.one_shot and served:
                    return
                served += 1
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def _serve(engine: Engine) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(engine.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


async def _get(pool: Http1Pool) -> bytes:
    response = await pool.request("POST", "/x", b"{}", {})
    return await response.read()


def test_a_connection_idle_past_keepalive_is_closed_not_reused() -> None:
    async def main() -> None:
        engine = Engine(one_shot=False)
        server, url = await _serve(engine)
        pool = Http1Pool(url, keepalive_s=0.2)
        assert await _get(pool) == b"{}"
        assert await _get(pool) == b"{}"
        assert engine.connections == 1  # reused while fresh
        await asyncio.sleep(0.3)
        assert await _get(pool) == b"{}"
        assert engine.connections == 2
        await pool.aclose()
        server.close()

    asyncio.run(main())


def test_a_pooled_connection_found_closed_takes_the_older_idle_ones_with_it() -> None:
    """Three idle connections, all closed by the engine: the first request meets
    one (a failure its caller retries as a new attempt); the retry must not meet
    the next one, but open a new connection."""

    async def main() -> None:
        engine = Engine(one_shot=True)
        server, url = await _serve(engine)
        pool = Http1Pool(url, keepalive_s=60)
        assert await asyncio.gather(*(_get(pool) for _ in range(3))) == [b"{}"] * 3
        assert engine.connections == 3
        with pytest.raises(ConnectionLost) as lost:
            await _get(pool)
        assert lost.value.reused
        assert await _get(pool) == b"{}"
        assert engine.connections == 4
        await pool.aclose()
        server.close()

    asyncio.run(main())


def test_an_idempotent_request_lost_on_a_closed_idle_connection_is_sent_again() -> None:
    """``/tokenize`` (before a call's record exists) gave a 502 when it met an
    idle connection the engine had closed; it changes nothing on the engine, so
    it is sent again. A generation is not: its caller retries it as a new,
    recorded attempt."""

    async def main() -> None:
        engine = Engine(one_shot=True)
        server, url = await _serve(engine)
        transport = EngineTransport(url, keepalive_s=60)
        assert await transport.post_json("/tokenize", {}, idempotent=True) == {}
        assert await transport.post_json("/tokenize", {}, idempotent=True) == {}
        assert engine.connections == 2
        with pytest.raises(EngineUnavailable, match="kept-alive"):
            await transport.post_json("/v1/chat/completions", {})
        await transport.aclose()
        server.close()

    asyncio.run(main())
