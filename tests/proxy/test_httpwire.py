"""The gateway's HTTP server: one write per loop turn, and disconnects told to the handler."""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

from polar.proxy.front.asgi import DisconnectWatch, send_body
from polar.proxy.front.httpwire import CONNECTION, CoalescingTransport, GatewayHttpProtocol
from polar.serverthread import ServerThread


class Recorder:
    """The transport underneath: what reached the socket, write by write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def get_write_buffer_size(self) -> int:
        return 0


def test_writes_of_one_loop_turn_leave_together_and_in_order() -> None:
    async def go() -> Recorder:
        loop = asyncio.get_running_loop()
        raw = Recorder()
        wire: Any = CoalescingTransport(raw, loop)  # type: ignore[arg-type]
        wire.write(b"head ")
        wire.write(memoryview(b"body"))
        wire.write(b"")
        assert raw.writes == [] and wire.get_write_buffer_size() == 9
        await asyncio.sleep(0)
        assert raw.writes == [b"head body"]
        wire.write(b"next")
        await asyncio.sleep(0)
        wire.writelines([b"a", b"b"])
        wire.close()  # sends what is held first
        assert raw.writes == [b"head body", b"next", b"ab"] and raw.closed
        assert wire.is_closing()  # the rest is the transport's
        return raw

    asyncio.run(go())


def test_abort_drops_what_is_held() -> None:
    async def go() -> Recorder:
        raw = Recorder()
        wire: Any = CoalescingTransport(raw, asyncio.get_running_loop())  # type: ignore[arg-type]
        wire.write(b"never sent")
        wire.abort()
        await asyncio.sleep(0)
        return raw

    raw = asyncio.run(go())
    assert raw.writes == [] and raw.aborted


def _exchange(port: int, request: bytes, until: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(request)
        got = b""
        while until not in got:
            chunk = conn.recv(65536)
            if not chunk:
                break
            got += chunk
        return got


def test_the_gateways_server_sends_whole_and_streamed_replies_and_reports_a_gone_client() -> None:
    gone = threading.Event()
    seen_connection: list[bool] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        seen_connection.append(isinstance(scope.get(CONNECTION), GatewayHttpProtocol))
        await receive()
        if scope["path"] == "/whole":
            await send_body(send, 200, b'{"ok":true}')
        elif scope["path"] == "/stream":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            for part in (b"one,", b"two,"):
                await send({"type": "http.response.body", "body": part, "more_body": True})
                await asyncio.sleep(0.01)
            await send({"type": "http.response.body", "body": b"three"})
        else:
            watch = DisconnectWatch(receive, scope)
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                if watch.disconnected:
                    gone.set()
                    return
                raise
            finally:
                watch.done()

    server = ServerThread(app, http=GatewayHttpProtocol).start()
    try:
        whole = _exchange(server.port, b"GET /whole HTTP/1.1\r\nHost: x\r\n\r\n", b"true}")
        assert whole.startswith(b"HTTP/1.1 200") and whole.endswith(b'\r\n\r\n{"ok":true}')
        streamed = _exchange(server.port, b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n", b"0\r\n\r\n")
        assert streamed.endswith(b"4\r\none,\r\n4\r\ntwo,\r\n5\r\nthree\r\n0\r\n\r\n")
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as conn:
            conn.sendall(b"GET /hang HTTP/1.1\r\nHost: x\r\n\r\n")
            threading.Event().wait(0.2)  # the handler is waiting; then the client leaves
        assert gone.wait(10), "the handler was not told its client left"
        assert seen_connection == [True, True, True]
    finally:
        server.stop()


def test_pipelined_requests_on_one_connection_each_get_their_reply() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await receive()
            await send_body(send, 200, scope["path"].encode())

    server = ServerThread(app, http=GatewayHttpProtocol).start()
    try:
        two = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n"
        got = _exchange(server.port, two, b"/b")
        assert got.count(b"HTTP/1.1 200") == 2 and got.index(b"/a") < got.index(b"/b")
    finally:
        server.stop()
