"""Credentials and request heads, as an operator tried them against the real gateway.

The admin token used to be accepted in ``x-api-key``, a request with two
``Authorization`` headers was served with the last one, and a 200 KB header
was read whole. Now the admin API takes its token only as ``Authorization:
Bearer``, a repeated credential header is a 400 (in the dialect's shape on a
model route), and a request head over 64 KiB is a 431 with the connection
closed; the gateway serves the next client as before.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any

import httpx

from polar.ir import Dialect
from polar.proxy.front.httpwire import MAX_HEAD_BYTES

from support.faulty import PATHS, assert_dialect_error, request_body
from support.stack import ADMIN_TOKEN


def _raw(url: str, request: bytes) -> bytes:
    """Send raw bytes; everything the gateway answers until it closes."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        # It may answer and close before reading everything.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(request)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


def test_the_admin_api_takes_its_token_only_as_a_bearer(make_stack: Any) -> None:
    stack = make_stack({"turns": []})
    for headers in ({"x-api-key": ADMIN_TOKEN}, {"authorization": ADMIN_TOKEN}):
        reply = httpx.get(f"{stack.url}/admin/status", headers=headers)
        assert reply.status_code == 401, (headers, reply.text)
        assert "Authorization: Bearer" in reply.json()["error"]["message"]
    ok = httpx.get(f"{stack.url}/admin/status", headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
    assert ok.status_code == 200


def test_a_repeated_credential_header_is_a_400_and_nothing_is_served(make_stack: Any) -> None:
    stack = make_stack({"turns": [{"text": "ok"}], "cycle": True})
    sid, key = stack.new_session()
    _, other = stack.new_session()
    repeated = [
        [("authorization", f"Bearer {other}"), ("authorization", f"Bearer {key}")],
        [("x-api-key", other), ("x-api-key", key)],
        [("authorization", f"Bearer {key}"), ("authorization", f"Bearer {key}")],
    ]
    for dialect, path in PATHS.items():
        for headers in repeated:
            reply = httpx.post(
                f"{stack.url}{path}",
                headers=[*headers, ("anthropic-version", "2023-06-01")],
                json=request_body(dialect, stream=False),
            )
            message = assert_dialect_error(dialect, reply, 400)
            assert "more than one" in message, message
    admin = httpx.get(
        f"{stack.url}/admin/status",
        headers=[("authorization", f"Bearer {ADMIN_TOKEN}")] * 2,
    )
    assert admin.status_code == 400, admin.text
    assert stack.records(sid) == []
    # One key, once (in both headers, as some clients send it): served.
    both = {"authorization": f"Bearer {key}", "x-api-key": key}
    reply = httpx.post(
        f"{stack.url}{PATHS[Dialect.OPENAI_CHAT]}",
        headers=both,
        json=request_body(Dialect.OPENAI_CHAT, stream=False),
    )
    assert reply.status_code == 200, reply.text


def test_a_request_head_over_the_limit_is_a_431_and_the_connection_closes(
    make_stack: Any,
) -> None:
    stack = make_stack({"turns": [{"text": "ok"}], "cycle": True})
    sid, key = stack.new_session()
    path = PATHS[Dialect.OPENAI_CHAT]
    body = request_body(Dialect.OPENAI_CHAT, stream=False)
    auth = {"authorization": f"Bearer {key}"}
    big = {**auth, "x-padding": "p" * (200 << 10)}
    many = {**auth, **{f"x-pad-{i}": "p" * 1000 for i in range(80)}}
    for headers in (big, many):
        reply = httpx.post(f"{stack.url}{path}", headers=headers, json=body)
        assert reply.status_code == 431, reply.text[:300]
        assert reply.headers["connection"] == "close"
        assert str(MAX_HEAD_BYTES) in reply.json()["error"]["message"]
    # A head that does not end is cut off too, once more than the limit (and one
    # read's worth: what arrived may end the request before) has arrived.
    padding = b"p" * (MAX_HEAD_BYTES + (257 << 10))
    endless = b"GET /health HTTP/1.1\r\nHost: x\r\nx-padding: " + padding
    assert _raw(stack.url, endless).startswith(b"HTTP/1.1 431 ")
    # Within the limit: served, and the gateway serves on.
    near = {**auth, "x-padding": "p" * (MAX_HEAD_BYTES // 2)}
    assert httpx.post(f"{stack.url}{path}", headers=near, json=body).status_code == 200
    assert httpx.get(f"{stack.url}/health").status_code == 200
    assert len(stack.records(sid)) == 1
