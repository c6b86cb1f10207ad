"""The router of a gateway group: one listening address, N workers behind it.

A model call (any ``POST`` outside ``/admin``) goes to the worker that owns its
session, found from the key in its head (:class:`RouteTable`: key hash →
worker); the router passes the bytes both ways unchanged and parses only the
framing (:mod:`.wire`), so streaming stays streaming. A key the table does not
know (forged, closed, missing) goes to worker 0, which answers it exactly as a
lone gateway would (401 in the dialect's shape). Everything else (the admin API,
``/health``, ``HEAD /``) is read whole and answered by :mod:`.fanout`.

Each client connection keeps one connection to each worker it has used; a
request is forwarded only once the reply to the previous one is whole, so a
connection that switches sessions (and so workers) can never get replies out of
order. While a reply is awaited the client's side is watched: a client that
hangs up has its worker connection closed, and the worker records the call
aborted, as it would for a direct client.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import httptools
import orjson

from polar.proxy.control.sessions import hash_key
from polar.proxy.errors import ProxyError, WorkerUnavailable
from polar.proxy.front.inbound import api_key_of
from polar.proxy.workers.affinity import owner_of
from polar.proxy.workers.wire import (
    BadFraming,
    ClientGone,
    Head,
    Inbound,
    copy_body,
    error_reply,
    parse_head,
    read_body,
    response,
)

if TYPE_CHECKING:
    from polar.proxy.workers.fanout import Fanout

_log = logging.getLogger(__name__)


class RouteTable:
    """Which worker serves each open session's key (only key hashes are kept)."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._by_hash: dict[str, int] = {}
        self._hash_of: dict[str, str] = {}

    def add(self, session_id: str, key_hash: str) -> None:
        self._by_hash[key_hash] = owner_of(session_id, self.workers)
        self._hash_of[session_id] = key_hash

    def drop(self, session_id: str) -> None:
        key_hash = self._hash_of.pop(session_id, None)
        if key_hash is not None:
            self._by_hash.pop(key_hash, None)

    def route(self, api_key: str | None) -> int:
        if not api_key:
            return 0
        return self._by_hash.get(hash_key(api_key), 0)

    def __len__(self) -> int:
        return len(self._by_hash)


@dataclass(slots=True)
class WorkerLink:
    """How the router reaches one worker, and whether it is up."""

    index: int
    socket_path: str
    up: bool = False
    pid: int | None = None


@dataclass(slots=True)
class _Upstream:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    reply: asyncio.Future[None] | None = None
    sent_any: bool = False
    closed: bool = False
    idle_since: float = field(default_factory=time.monotonic)
    pump: asyncio.Task[None] | None = None

    def on_message_complete(self) -> None:
        reply = self.reply
        if reply is not None and not reply.done():
            reply.set_result(None)

    def close(self) -> None:
        self.closed = True
        self.writer.close()
        self.on_message_complete()


class Router:
    def __init__(
        self,
        links: list[WorkerLink],
        table: RouteTable,
        *,
        fanout: Fanout,
        idle_s: float,
    ) -> None:
        """``idle_s``: how long a client connection may sit idle between requests
        (the gateway's ``keepalive_s``); worker connections are reused within half of it."""
        self.links = links
        self.table = table
        self.fanout = fanout
        self._idle_s = idle_s
        self._reuse_s = idle_s / 2

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        inbound = Inbound(reader)
        upstreams: dict[int, _Upstream] = {}
        try:
            while True:
                try:
                    try:
                        async with asyncio.timeout(self._idle_s):
                            raw = await inbound.head()
                    except TimeoutError:
                        return
                    if raw is None:
                        return
                    head = parse_head(raw)
                    if head.method == "POST" and not head.path.startswith("/admin"):
                        keep = await self._forward(head, inbound, writer, upstreams)
                    else:
                        body = await read_body(head, inbound, self.fanout.body_limit)
                        reply = await self.fanout.answer(head, body)
                        writer.write(reply)
                        keep = head.keep_alive
                except BadFraming as exc:
                    writer.write(response(exc.status, _plain(str(exc)), close=True))
                    return
                except ClientGone:
                    return
                await writer.drain()
                if not keep:
                    return
        except (ConnectionError, OSError):
            return
        finally:
            inbound.cancel()
            for upstream in upstreams.values():
                upstream.close()
                if upstream.pump is not None:
                    upstream.pump.cancel()
            writer.close()

    async def _upstream(
        self, index: int, upstreams: dict[int, _Upstream], client: asyncio.StreamWriter
    ) -> _Upstream | None:
        link = self.links[index]
        upstream = upstreams.get(index)
        if upstream is not None and (
            upstream.closed or time.monotonic() - upstream.idle_since > self._reuse_s
        ):
            # Never reuse a connection the worker may be closing as idle.
            upstream.close()
            upstream = None
        if upstream is None:
            if not link.up:
                return None
            try:
                reader, writer = await asyncio.open_unix_connection(link.socket_path)
            except OSError:
                return None
            upstream = _Upstream(reader, writer)
            upstream.pump = asyncio.ensure_future(_pump(upstream, client))
            upstreams[index] = upstream
        return upstream

    async def _forward(
        self,
        head: Head,
        inbound: Inbound,
        client: asyncio.StreamWriter,
        upstreams: dict[int, _Upstream],
    ) -> bool:
        """Pass one call to its worker and its reply back; whether the client
        connection may carry another request."""
        index = self.table.route(_key(head))
        upstream = await self._upstream(index, upstreams, client)
        if upstream is None:
            error = WorkerUnavailable(
                f"the gateway worker serving this session (worker {index}) is restarting; "
                "retry shortly"
            )
            client.write(error_reply(head.path, error, close=True))
            return False
        loop = asyncio.get_running_loop()
        reply = upstream.reply = loop.create_future()
        upstream.sent_any = False
        upstream.writer.write(head.raw)
        try:
            await copy_body(head, inbound, upstream.writer)
        except ClientGone:
            upstream.close()
            raise
        except (ConnectionError, OSError):
            # The worker stopped reading (it answered early, e.g. 413, or died):
            # what the client still sends cannot be framed for another request.
            head = dataclasses.replace(head, keep_alive=False)
        # Wait for the reply, watching for the client hanging up meanwhile.
        while not reply.done():
            if inbound.eof or len(inbound.buf) > (1 << 20):
                await reply
                break
            more = inbound.more()
            await asyncio.wait((reply, more), return_when=asyncio.FIRST_COMPLETED)
            if more.done() and not inbound.took():
                upstream.close()  # the worker sees the disconnect and aborts the call
                return False
        upstream.idle_since = time.monotonic()
        if upstream.closed:
            upstreams.pop(index, None)
            if not upstream.sent_any:
                error = WorkerUnavailable(
                    f"the gateway worker serving this session (worker {index}) stopped "
                    "before answering; retry shortly"
                )
                client.write(error_reply(head.path, error, close=True))
            return False
        return head.keep_alive


async def _pump(upstream: _Upstream, client: asyncio.StreamWriter) -> None:
    """Worker → client, bytes unchanged; the parser only marks where replies end."""
    ends = _Ends(upstream)
    parser = ends.parser = httptools.HttpResponseParser(ends)
    try:
        while True:
            data = await upstream.reader.read(1 << 16)
            if not data:
                break
            upstream.sent_any = True
            client.write(data)
            parser.feed_data(data)
            if client.transport.get_write_buffer_size() > (1 << 20):
                await client.drain()
    except (httptools.HttpParserError, ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            upstream.close()


class _Ends:
    """httptools callbacks: a final (non-1xx) reply is whole."""

    def __init__(self, upstream: _Upstream) -> None:
        self._upstream = upstream
        self.parser: httptools.HttpResponseParser | None = None

    def on_message_complete(self) -> None:
        if self.parser is not None and self.parser.get_status_code() >= 200:
            self._upstream.on_message_complete()


def _plain(message: str) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": "invalid_request_error"}})


def _key(head: Head) -> str | None:
    """The session key that routes a call; none for a request that repeats a
    credential header (worker 0 refuses it in the dialect's shape)."""
    try:
        return api_key_of(head.fields, head.target.partition("?")[2].encode("latin-1"))
    except ProxyError:
        return None
