"""A logging reverse proxy between an agent CLI and the gateway.

It forwards every request as is and keeps the exact bytes of every reply, so a
test can check what a CLI *received*, not what the gateway meant to send.
:func:`received_turn` adds a reply up, per dialect, to the assistant turn the
client sees (reasoning, text, tool calls).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from support.grammar import (
    check_anthropic_stream,
    check_gemini_stream,
    check_responses_stream,
    gemini_events,
    sse_events,
)

HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection"}


@dataclass
class Exchange:
    method: str
    path: str
    request: bytes
    status: int = 0
    reply: bytearray = field(default_factory=bytearray)


class Recorder:
    """``app`` forwards to ``upstream``; ``exchanges`` keeps every call in order."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.exchanges: list[Exchange] = []
        self.app = Starlette(
            routes=[Route("/{path:path}", self._forward, methods=["GET", "POST", "HEAD"])]
        )

    def posts(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.method == "POST" and e.status == 200]

    async def _forward(self, request: Request) -> Response:
        body = await request.body()
        exchange = Exchange(request.method, request.url.path, body)
        self.exchanges.append(exchange)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        client = httpx.AsyncClient(timeout=httpx.Timeout(600.0))
        target = f"{self.upstream}{request.url.path}"
        if request.url.query:
            target += f"?{request.url.query}"
        upstream = await client.send(
            client.build_request(request.method, target, headers=headers, content=body),
            stream=True,
        )
        exchange.status = upstream.status_code

        async def relay() -> Any:
            try:
                async for chunk in upstream.aiter_raw():
                    exchange.reply.extend(chunk)
                    yield chunk
            finally:
                await upstream.aclose()
                await client.aclose()

        reply_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS}
        return StreamingResponse(relay(), status_code=upstream.status_code, headers=reply_headers)


@dataclass
class Turn:
    reasoning: str
    text: str
    tool_calls: list[tuple[str, Any]]
    """(name, parsed arguments) in order."""


def received_turn(exchange: Exchange) -> Turn:
    """The assistant turn a client got, from the bytes it got."""
    raw = exchange.reply.decode("utf-8")
    path = exchange.path
    streamed = raw.lstrip().startswith(("data:", "event:"))
    if path.endswith("/messages"):
        message = check_anthropic_stream(sse_events(raw)) if streamed else json.loads(raw)
        blocks = message["content"]
        return Turn(
            "".join(b["thinking"] for b in blocks if b["type"] == "thinking"),
            "".join(b["text"] for b in blocks if b["type"] == "text"),
            [(b["name"], b["input"]) for b in blocks if b["type"] == "tool_use"],
        )
    if path.endswith("/responses"):
        response = check_responses_stream(sse_events(raw)) if streamed else json.loads(raw)
        items = response["output"]
        return Turn(
            "".join(
                part["text"]
                for i in items
                if i["type"] == "reasoning"
                for part in (i.get("content") or i.get("summary") or [])
            ),
            "".join(
                part["text"]
                for i in items
                if i["type"] == "message"
                for part in i["content"]
                if part["type"] == "output_text"
            ),
            [
                (i["name"], json.loads(i["arguments"]))
                for i in items
                if i["type"] == "function_call"
            ],
        )
    if path.endswith(("generateContent", "GenerateContent")):
        response = check_gemini_stream(gemini_events(raw)) if streamed else json.loads(raw)
        parts = response["candidates"][0]["content"]["parts"]
        return Turn(
            "".join(p["text"] for p in parts if p.get("thought")),
            "".join(p["text"] for p in parts if "text" in p and not p.get("thought")),
            [
                (p["functionCall"]["name"], p["functionCall"]["args"])
                for p in parts
                if "functionCall" in p
            ],
        )
    return _chat_turn(raw, streamed)


def _chat_turn(raw: str, streamed: bool) -> Turn:
    if not streamed:
        message = json.loads(raw)["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        return Turn(
            message.get("reasoning_content") or "",
            message.get("content") or "",
            [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls],
        )
    reasoning, text = [], []
    calls: dict[int, dict[str, str]] = {}
    for block in raw.split("\n\n"):
        data = block.strip().removeprefix("data: ")
        if not data or data == "[DONE]":
            continue
        for choice in json.loads(data).get("choices") or []:
            delta = choice.get("delta") or {}
            reasoning.append(delta.get("reasoning_content") or "")
            text.append(delta.get("content") or "")
            for piece in delta.get("tool_calls") or []:
                call = calls.setdefault(piece["index"], {"name": "", "arguments": ""})
                function = piece.get("function") or {}
                call["name"] += function.get("name") or ""
                call["arguments"] += function.get("arguments") or ""
    return Turn(
        "".join(reasoning),
        "".join(text),
        [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())],
    )
