"""Strict HTTP/1.1 request heads (``polar.http1``), the one parser the gateway
relay and a gateway group's router share: what two parsers could frame
differently is refused with a status, and a response's end is found."""

from __future__ import annotations

import asyncio

import pytest

from polar.http1 import (
    MAX_HEADERS,
    Framing,
    HttpError,
    parse_request,
    parse_response,
    relay_body,
)


def _head(*lines: str, start: str = "POST /v1/chat/completions HTTP/1.1") -> bytes:
    return ("\r\n".join([start, *lines]) + "\r\n\r\n").encode()


def test_a_request_head_is_read_with_its_framing() -> None:
    request = parse_request(
        _head("Host: x", "Authorization: Bearer k1", "Content-Length: 12", "Connection: close")
    )
    assert (request.method, request.target, request.path) == (
        "POST",
        "/v1/chat/completions",
        "/v1/chat/completions",
    )
    assert (request.framing, request.length, request.keep_alive) == (Framing.LENGTH, 12, False)
    assert request.head.values(b"authorization") == [b"Bearer k1"]
    chunked = parse_request(_head("Transfer-Encoding: chunked"))
    assert chunked.framing is Framing.CHUNKED and chunked.keep_alive
    query = parse_request(_head(start="GET /v1/models?key=k HTTP/1.1"))
    assert (query.path, query.target, query.framing) == (
        "/v1/models",
        "/v1/models?key=k",
        Framing.NONE,
    )


@pytest.mark.parametrize(
    ("version", "connection", "keep_alive"),
    [
        ("HTTP/1.1", None, True),
        ("HTTP/1.1", "close", False),
        ("HTTP/1.0", None, False),
        ("HTTP/1.0", "keep-alive", True),
        ("HTTP/1.0", "keep-alive, close", False),
    ],
)
def test_keep_alive_follows_the_version_and_close_wins(
    version: str, connection: str | None, keep_alive: bool
) -> None:
    lines = [f"Connection: {connection}"] if connection else []
    assert parse_request(_head(*lines, start=f"GET / {version}")).keep_alive is keep_alive


def test_an_upgrade_is_reported_for_the_caller_to_refuse() -> None:
    assert parse_request(_head("Connection: upgrade", "Upgrade: h2c")).upgrade
    assert parse_request(_head("Upgrade: websocket")).upgrade
    assert not parse_request(_head("Connection: keep-alive")).upgrade


@pytest.mark.parametrize(
    ("lines", "status"),
    [
        (("Content-Length: 5", "Content-Length: 6"), 400),
        (("Content-Length: 5", "Content-Length: 5"), 400),
        (("Content-Length: 5", "Transfer-Encoding: chunked"), 400),
        (("Transfer-Encoding: gzip, chunked",), 501),
        (("Transfer-Encoding: chunked", "Transfer-Encoding: chunked"), 501),
        (("Content-Length: -1",), 400),
        (("Content-Length: 1e3",), 400),
        (("X-A: 1", " folded"), 400),
        (("Bad Name : 1",), 400),
        (("NoColon",), 400),
        (("X-A: a\x01b",), 400),
        (("X-A: 1\nX-B: 2",), 400),
        (tuple(f"X-{i}: 1" for i in range(MAX_HEADERS + 1)), 431),
    ],
)
def test_an_ambiguous_head_is_refused_with_its_status(lines: tuple[str, ...], status: int) -> None:
    with pytest.raises(HttpError) as refused:
        parse_request(_head(*lines))
    assert refused.value.status == status


@pytest.mark.parametrize(
    ("start", "status"),
    [
        ("POST /v1/chat/completions HTTP/2.0", 505),
        ("POST http://127.0.0.1/admin HTTP/1.1", 400),
        ("POST * HTTP/1.1", 400),
        ("PO(ST /v1/chat/completions HTTP/1.1", 400),
        ("POST /v1/chat/completions", 400),
    ],
)
def test_a_request_line_that_is_not_origin_form_http1_is_refused(start: str, status: int) -> None:
    with pytest.raises(HttpError) as refused:
        parse_request(_head(start=start))
    assert refused.value.status == status


def test_chunked_framing_needs_http_1_1() -> None:
    with pytest.raises(HttpError) as refused:
        parse_request(_head("Transfer-Encoding: chunked", start="POST / HTTP/1.0"))
    assert refused.value.status == 501


def test_a_response_head_is_read_leniently_for_its_end() -> None:
    sized = parse_response(b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\n", "POST")
    assert (sized.status, sized.framing, sized.length, sized.keep_alive) == (
        200,
        Framing.LENGTH,
        7,
        True,
    )
    streamed = parse_response(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n", "POST")
    assert streamed.framing is Framing.CHUNKED
    assert parse_response(b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\n", "HEAD").framing is (
        Framing.NONE
    )
    until_close = parse_response(b"HTTP/1.1 200 OK\r\n\r\n", "GET")
    assert until_close.framing is Framing.UNTIL_CLOSE and not until_close.keep_alive


def _relayed(framing: Framing, length: int, raw: bytes, *, strict: bool) -> tuple[bytes, bytes]:
    """What ``relay_body`` copies of ``raw``, and what it leaves unread."""

    async def run() -> tuple[bytes, bytes]:
        reader = asyncio.StreamReader()
        reader.feed_data(raw)
        reader.feed_eof()
        sent = bytearray()

        class Sink:
            def write(self, data: bytes) -> None:
                sent.extend(data)

            async def drain(self) -> None:
                return None

        await relay_body(framing, length, reader, Sink(), strict=strict)  # type: ignore[arg-type]
        return bytes(sent), await reader.read()

    return asyncio.run(run())


def test_bodies_are_relayed_whole_and_nothing_more() -> None:
    assert _relayed(Framing.LENGTH, 5, b"helloNEXT", strict=True) == (b"hello", b"NEXT")
    chunked = b"5;ext=1\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\n"
    assert _relayed(Framing.CHUNKED, 0, chunked + b"NEXT", strict=True) == (chunked, b"NEXT")
    with pytest.raises(HttpError):
        _relayed(Framing.CHUNKED, 0, b"0x5\r\nhello\r\n0\r\n\r\n", strict=True)
