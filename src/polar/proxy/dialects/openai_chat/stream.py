"""Server-sent events for streamed Chat Completions.

Event order, as OpenAI sends it: a role chunk, content / reasoning /
tool-call delta chunks, a chunk with ``finish_reason`` and an empty delta,
a usage chunk with ``"choices": []`` when ``stream_options.include_usage``
is set, then ``data: [DONE]``. Each delta chunk is encoded from a
pre-rendered prefix and suffix, so only the delta itself is serialised.
"""

from __future__ import annotations

from typing import Any

import orjson

from polar.ir import Delta, Finish
from polar.proxy.dialects.openai_chat.translate import finish_reason, logprobs_json, usage_json
from polar.proxy.dialects.openai_errors import error_json
from polar.proxy.errors import ProxyError

DONE = b"data: [DONE]\n\n"


class ChunkEncoder:
    """Encodes one call's IR events as Chat Completions SSE bytes."""

    def __init__(
        self,
        *,
        response_id: str,
        created: int,
        model: str,
        reasoning_field: str | None,
        top_logprobs: int | None,
        include_usage: bool,
    ) -> None:
        head = orjson.dumps(
            {
                "id": response_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
            }
        )
        self._head = b"data: " + head[:-1] + b',"choices":[{"index":0,"delta":'
        self._envelope = head[:-1]
        self._reasoning_field = reasoning_field
        self._top = top_logprobs
        self._include_usage = include_usage
        self._usage_null = b',"usage":null' if include_usage else b""
        self._announced: set[int] = set()

    def _chunk(self, delta: dict[str, Any], logprobs: bytes, finish: bytes) -> bytes:
        return (
            self._head
            + orjson.dumps(delta)
            + b',"logprobs":'
            + logprobs
            + b',"finish_reason":'
            + finish
            + b"}]"
            + self._usage_null
            + b"}\n\n"
        )

    def start(self, prompt_tokens: int) -> bytes:
        return self._chunk({"role": "assistant", "content": "", "refusal": None}, b"null", b"null")

    def delta(self, event: Delta) -> bytes:
        wire: dict[str, Any] = {}
        if event.reasoning and self._reasoning_field is not None:
            wire[self._reasoning_field] = event.reasoning
        if event.text:
            wire["content"] = event.text
        pieces = [p for p in event.tool_calls if not p.discard]  # cannot withdraw a call here
        if pieces:
            calls = []
            for piece in pieces:
                call: dict[str, Any] = {"index": piece.index}
                function: dict[str, str] = {}
                if piece.index not in self._announced:
                    self._announced.add(piece.index)
                    if piece.id is not None:
                        call["id"] = piece.id
                    call["type"] = "function"
                    function["name"] = piece.name or ""
                function["arguments"] = piece.arguments
                call["function"] = function
                calls.append(call)
            wire["tool_calls"] = calls
        logprobs = b"null"
        if self._top is not None and event.details:
            logprobs = orjson.dumps(
                {"content": logprobs_json(event.details, self._top), "refusal": None}
            )
        if not wire and logprobs == b"null":
            # Tokens with nothing visible (e.g. "</think>") and no logprobs asked for.
            return b""
        return self._chunk(wire, logprobs, b"null")

    def finish(self, event: Finish) -> bytes:
        out = self._chunk({}, b"null", b'"' + finish_reason(event.reason).encode() + b'"')
        if self._include_usage:
            out += (
                b"data: "
                + self._envelope
                + b',"choices":[],"usage":'
                + orjson.dumps(usage_json(event.usage))
                + b"}\n\n"
            )
        return out + DONE

    @staticmethod
    def error(error: ProxyError) -> bytes:
        """An error after the stream started: an error event, then ``[DONE]``."""
        return b"data: " + orjson.dumps(error_json(error)) + b"\n\n" + DONE
