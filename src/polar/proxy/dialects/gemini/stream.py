"""Server-sent events for ``streamGenerateContent?alt=sse``.

Each event is one ``data: <GenerateContentResponse>`` (no ``event:`` lines, no
``[DONE]``), its candidate's ``content`` holding the parts new since the last
one: thought text (when the client asked for thoughts), text, and whole
``functionCall`` parts. Text streams as it is sampled; a function call goes
out once its arguments are complete (the Gemini API never splits a call), so
a call the parser withdraws mid-way is never sent, its text follows instead.
The last event carries ``finishReason`` and ``usageMetadata``: a stream the
Gemini CLI sees end without a finish reason it retries. An error after the
stream began is a last event holding Google's error object.
"""

from __future__ import annotations

from typing import Any

import orjson

from polar.ir import ChatRequest, Delta, Finish, TokenLogprob
from polar.proxy.dialects.gemini.translate import (
    candidate_json,
    error_json,
    finish_reason,
    function_call_part,
    model_name,
    shows_thoughts,
    usage_json,
)
from polar.proxy.errors import ProxyError


def event(data: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\r\n\r\n"


class ChunkEncoder:
    def __init__(self, request: ChatRequest, *, response_id: str) -> None:
        self._request = request
        self._id = response_id
        self._model = model_name(request.model)
        self._thoughts = shows_thoughts(request)
        self._top = request.top_logprobs
        self._details: list[TokenLogprob] = []
        self._calls: dict[int, list[str]] = {}  # index -> [name, arguments so far]
        # Whitespace before any text is template glue (between reasoning and a
        # call): it is sent only if real text follows.
        self._blank = ""
        self._texted = False

    def _chunk(self, parts: list[dict[str, Any]], finish: Finish | None = None) -> bytes:
        details = None
        if self._top is not None:
            details, self._details = tuple(self._details), []
        data: dict[str, Any] = {
            "candidates": [
                candidate_json(
                    parts,
                    reason=finish_reason(finish.reason) if finish is not None else None,
                    details=details,
                    top=self._top or 0,
                )
            ],
        }
        if finish is not None:
            data["usageMetadata"] = usage_json(finish.usage)
        data["modelVersion"] = self._model
        data["responseId"] = self._id
        return event(data)

    def _complete_calls(self) -> list[dict[str, Any]]:
        parts = [function_call_part(name, arguments) for name, arguments in self._calls.values()]
        self._calls.clear()
        return parts

    def start(self, prompt_tokens: int) -> bytes:
        return b""

    def delta(self, event_: Delta) -> bytes:
        if self._top is not None and event_.details:
            self._details.extend(event_.details)
        parts: list[dict[str, Any]] = []
        if event_.reasoning and self._thoughts:
            parts.append({"text": event_.reasoning, "thought": True})
        text = event_.text
        if text and not self._texted and not (self._blank + text).strip():
            self._blank += text
            text = ""
        if text:
            parts += self._complete_calls()
            if not self._texted:
                text, self._blank, self._texted = self._blank + text, "", True
            parts.append({"text": text})
        for piece in event_.tool_calls:
            if piece.discard:
                self._calls.pop(piece.index, None)  # never sent; its text follows
                continue
            if piece.index not in self._calls:
                parts += self._complete_calls()
                self._calls[piece.index] = [piece.name or "", ""]
            self._calls[piece.index][1] += piece.arguments
        return self._chunk(parts) if parts else b""

    def finish(self, finish: Finish) -> bytes:
        return self._chunk(self._complete_calls(), finish)

    def error(self, error: ProxyError) -> bytes:
        return event(error_json(error))
