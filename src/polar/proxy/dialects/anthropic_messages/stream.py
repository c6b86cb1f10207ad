"""Server-sent events for streamed Anthropic Messages.

Event order: ``message_start``; then content blocks one after another, each
``content_block_start``, its deltas (``thinking_delta`` + a closing
``signature_delta``, ``text_delta``, or ``input_json_delta`` for ``tool_use``),
``content_block_stop``; then ``message_delta`` (stop reason, output tokens)
and ``message_stop``. Errors after the start are an ``error`` event.
"""

from __future__ import annotations

from typing import Any

import orjson

from polar.ir import ChatRequest, Delta, Finish
from polar.proxy.dialects.anthropic_messages.translate import (
    error_json,
    shows_thinking,
    signature_for,
    stop_reason,
    usage_json,
)
from polar.proxy.errors import ProxyError


def event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class EventEncoder:
    def __init__(self, request: ChatRequest, *, message_id: str) -> None:
        self._request = request
        self._id = message_id
        self._thinking = shows_thinking(request)
        self._index = -1
        self._open: str | None = None  # "thinking", "text" or "tool:<n>"
        self._reasoning: list[str] = []
        self._output_tokens = 0
        # Whitespace between reasoning and a tool call is template glue: it opens
        # no text block unless real text follows.
        self._blank = ""

    def start(self, prompt_tokens: int) -> bytes:
        message: dict[str, Any] = {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "model": self._request.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": prompt_tokens,
                "output_tokens": 0,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }
        return event("message_start", {"type": "message_start", "message": message})

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        out = b""
        if self._open == "thinking":
            signature = signature_for("".join(self._reasoning))
            out += event(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": self._index,
                    "delta": {"type": "signature_delta", "signature": signature},
                },
            )
        self._open = None
        return out + event(
            "content_block_stop", {"type": "content_block_stop", "index": self._index}
        )

    def _begin(self, key: str, block: dict[str, Any]) -> bytes:
        out = self._close()
        self._index += 1
        self._open = key
        return out + event(
            "content_block_start",
            {"type": "content_block_start", "index": self._index, "content_block": block},
        )

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return event(
            "content_block_delta",
            {"type": "content_block_delta", "index": self._index, "delta": delta},
        )

    def delta(self, event_: Delta) -> bytes:
        self._output_tokens += len(event_.token_ids)
        out = b""
        if event_.reasoning and self._thinking:
            if self._open != "thinking":
                self._reasoning = []
                out += self._begin(
                    "thinking", {"type": "thinking", "thinking": "", "signature": ""}
                )
            self._reasoning.append(event_.reasoning)
            out += self._delta({"type": "thinking_delta", "thinking": event_.reasoning})
        text = event_.text
        if text and self._open != "text" and not (self._blank + text).strip():
            self._blank += text
            text = ""
        if text:
            if self._open != "text":
                out += self._begin("text", {"type": "text", "text": ""})
                text, self._blank = self._blank + text, ""
            out += self._delta({"type": "text_delta", "text": text})
        for piece in event_.tool_calls:
            if piece.discard:
                continue  # a streamed tool_use block cannot be withdrawn; its text follows
            key = f"tool:{piece.index}"
            if self._open != key:
                block = {
                    "type": "tool_use",
                    "id": piece.id or "",
                    "name": piece.name or "",
                    "input": {},
                }
                out += self._begin(key, block)
            if piece.arguments:
                out += self._delta({"type": "input_json_delta", "partial_json": piece.arguments})
        return out

    def finish(self, finish: Finish) -> bytes:
        reason, sequence = stop_reason(
            finish.reason, finish.matched_stop, self._request.sampling.stop
        )
        usage = usage_json(finish.usage)
        return (
            self._close()
            + event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": sequence},
                    "usage": {"output_tokens": usage["output_tokens"]},
                },
            )
            + event("message_stop", {"type": "message_stop"})
        )

    def error(self, error: ProxyError) -> bytes:
        return event("error", error_json(error))
