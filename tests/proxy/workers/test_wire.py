"""The router's framing (``polar.proxy.workers.wire``): what it forwards is
framed exactly as the worker will read it, and a head it cannot frame without
doubt is refused before any worker sees it."""

from __future__ import annotations

import asyncio

import pytest

from polar.proxy.workers.wire import BadFraming, Inbound, copy_body, parse_head, read_body


def _head(*lines: str) -> bytes:
    return ("\r\n".join(["POST /v1/chat/completions HTTP/1.1", *lines]) + "\r\n\r\n").encode()


def test_a_head_is_read_with_its_framing() -> None:
    head = parse_head(
        _head("Host: x", "Authorization: Bearer k1", "Content-Length: 12", "Connection: close")
    )
    assert (head.method, head.path, head.length, head.chunked) == (
        "POST",
        "/v1/chat/completions",
        12,
        False,
    )
    assert head.headers["authorization"] == "Bearer k1" and head.keep_alive is False
    assert parse_head(_head("Transfer-Encoding: chunked")).chunked


@pytest.mark.parametrize(
    "lines",
    [
        ("Content-Length: 5", "Content-Length: 6"),
        ("Content-Length: 5", "Transfer-Encoding: chunked"),
        ("Transfer-Encoding: gzip, chunked",),
        ("Transfer-Encoding: chunked", "Transfer-Encoding: chunked"),
        ("Content-Length: -1",),
        ("Content-Length: 1e3",),
        ("X-A: 1", " folded"),
        ("Bad Name : 1",),
        ("NoColon",),
    ],
)
def test_an_ambiguous_head_is_refused(lines: tuple[str, ...]) -> None:
    with pytest.raises(BadFraming):
        parse_head(_head(*lines))


def _copy(raw: bytes) -> tuple[bytes, bytes]:
    """What ``copy_body`` forwards of ``raw`` (head and body), and what it leaves."""

    async def run() -> tuple[bytes, bytes]:
        reader = asyncio.StreamReader()
        reader.feed_data(raw)
        reader.feed_eof()
        inbound = Inbound(reader)
        head = parse_head(await inbound.head() or b"")
        sent = bytearray()

        class Sink:
            class transport:  # a StreamWriter's transport, as copy_body reads it
                @staticmethod
                def get_write_buffer_size() -> int:
                    return 0

            def write(self, data: bytes) -> None:
                sent.extend(data)

        await copy_body(head, inbound, Sink())  # type: ignore[arg-type]
        return bytes(sent), bytes(inbound.buf) + await reader.read()

    return asyncio.run(run())


def test_bodies_are_forwarded_whole_and_nothing_more() -> None:
    sized = _head("Content-Length: 5") + b"hello" + b"GET / HTTP/1.1\r\n\r\n"
    assert _copy(sized) == (b"hello", b"GET / HTTP/1.1\r\n\r\n")
    chunked = b"5;ext=1\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\n"
    raw = _head("Transfer-Encoding: chunked") + chunked + b"NEXT"
    assert _copy(raw) == (chunked, b"NEXT")


def test_a_whole_body_is_read_for_the_admin_api() -> None:
    async def run(raw: bytes, limit: int) -> bytes:
        reader = asyncio.StreamReader()
        reader.feed_data(raw)
        reader.feed_eof()
        inbound = Inbound(reader)
        head = parse_head(await inbound.head() or b"")
        return await read_body(head, inbound, limit)

    chunked = _head("Transfer-Encoding: chunked") + b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    assert asyncio.run(run(chunked, 100)) == b"abcde"
    with pytest.raises(BadFraming):
        asyncio.run(run(_head("Content-Length: 101") + b"x" * 101, 100))


def test_a_refused_head_is_answered_with_the_strict_parsers_status() -> None:
    with pytest.raises(BadFraming) as refused:
        parse_head(_head("Transfer-Encoding: gzip"))
    assert refused.value.status == 501
    with pytest.raises(BadFraming) as refused:
        parse_head(_head("Content-Length: x"))
    assert refused.value.status == 400
