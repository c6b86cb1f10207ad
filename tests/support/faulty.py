"""A misbehaving engine and per-dialect request helpers for failure tests.

:class:`FaultyEngine` is a real HTTP/1.1 server (a thread of the standard
library's ``http.server``) that answers every request with whatever reply it is
told to, by path: a wrong JSON shape, bad token ids, an error status, a stream
that stops, a reset, a stall. It stands in for a broken vLLM or SGLang, which
cannot be made to misbehave on purpose.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import orjson

from polar.ir import Dialect

PATHS = {
    Dialect.OPENAI_CHAT: "/v1/chat/completions",
    Dialect.ANTHROPIC_MESSAGES: "/v1/messages",
    Dialect.OPENAI_RESPONSES: "/v1/responses",
}


def request_body(dialect: Dialect, *, stream: bool, **extra: Any) -> dict[str, Any]:
    """A minimal valid request of ``dialect``."""
    match dialect:
        case Dialect.OPENAI_CHAT:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        case Dialect.ANTHROPIC_MESSAGES:
            body = {
                "model": "m",
                "max_tokens": 16,
                "messages": [{"role": "user", "content": "hi"}],
            }
        case Dialect.OPENAI_RESPONSES:
            body = {"model": "m", "input": "hi"}
    return {**body, "stream": stream, **extra}


def client_headers(key: str) -> dict[str, str]:
    return {
        "authorization": f"Bearer {key}",
        "x-api-key": key,
        "anthropic-version": "2023-06-01",
        "content-type": "application/json",
    }


def assert_dialect_error(dialect: Dialect, reply: httpx.Response, status: int) -> str:
    """The reply is ``status`` with an error body in ``dialect``'s shape; returns its message."""
    assert reply.status_code == status, (reply.status_code, reply.text[:500])
    body = reply.json()
    if dialect is Dialect.ANTHROPIC_MESSAGES:
        assert body["type"] == "error", body
        assert isinstance(body["error"]["type"], str), body
    else:
        assert set(body) == {"error"}, body
        assert "type" in body["error"], body
    message = body["error"]["message"]
    assert isinstance(message, str) and message, body
    return message


@dataclass
class Reply:
    status: int = 200
    body: bytes = b"{}"
    content_type: str = "application/json"
    delay_s: float = 0.0
    """Silence before the reply (a stalled engine)."""
    reset: bool = False
    """Close the connection without a reply."""
    hold: threading.Event | None = None
    """Say nothing until this is set (a stall the test ends), at most a minute."""


Route = Reply | Callable[[Message], Reply]
"""A path's reply, or a function of the request's headers that chooses one."""


def chat_reply(token_ids: list[Any], logprobs: list[Any], text: str = "x") -> bytes:
    """A vLLM chat completion (not streamed) sampling ``token_ids``."""
    return orjson.dumps(
        {
            "prompt_token_ids": [1, 2, 3],
            "choices": [
                {
                    "message": {"role": "assistant", "content": text},
                    "token_ids": token_ids,
                    "logprobs": {
                        "content": [{"token": "x", "logprob": lp, "bytes": None} for lp in logprobs]
                    },
                    "finish_reason": "stop",
                }
            ],
        }
    )


@dataclass
class FaultyEngine:
    reply: Reply = field(default_factory=Reply)
    """What a POST to a path without a route gets."""
    routes: dict[str, Route] = field(default_factory=dict)
    """Replies by path (GET and POST); a GET without a route is a 404."""
    requests: list[bytes] = field(default_factory=list)
    request_ids: list[str] = field(default_factory=list)
    seen: list[tuple[str, str, str]] = field(default_factory=list)
    """(method, path, ``x-request-id``) of every request, in arrival order."""
    resets: int = 0
    """How many of the next requests get their connection closed without a reply."""

    def __post_init__(self) -> None:
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                engine.seen.append(("GET", self.path, self.headers.get("x-request-id", "")))
                self.answer(engine.routes.get(self.path, Reply(status=404, body=b"{}")))

            def do_POST(self) -> None:
                size = int(self.headers.get("content-length") or 0)
                engine.requests.append(self.rfile.read(size))
                engine.request_ids.append(self.headers.get("x-request-id", ""))
                engine.seen.append(("POST", self.path, self.headers.get("x-request-id", "")))
                if engine.resets > 0:
                    engine.resets -= 1
                    self.answer(Reply(reset=True))
                    return
                self.answer(engine.routes.get(self.path, engine.reply))

            def answer(self, route: Route) -> None:
                reply = route if isinstance(route, Reply) else route(self.headers)
                if reply.reset:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if reply.hold is not None:
                    reply.hold.wait(timeout=60)
                time.sleep(reply.delay_s)
                self.send_response(reply.status)
                self.send_header("content-type", reply.content_type)
                self.send_header("content-length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # the gateway hung up on a stalled reply: expected here

        self._server = Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def paths(self, method: str, path: str) -> list[str]:
        """The request ids of the ``method`` requests to ``path`` so far."""
        return [rid for m, p, rid in self.seen if (m, p) == (method, path)]

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
