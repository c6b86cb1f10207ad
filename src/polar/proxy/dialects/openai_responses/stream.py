"""Server-sent events for streamed OpenAI Responses.

``response.created``, ``response.in_progress``; then each output item in turn:
``response.output_item.added``, its content events (reasoning:
``content_part.added``, ``reasoning_text.delta``/``.done``,
``content_part.done``; message: ``content_part.added``,
``output_text.delta``/``.done``, ``content_part.done``; function call:
``function_call_arguments.delta``/``.done``), ``response.output_item.done``;
finally ``response.completed`` (``response.incomplete`` at the length limit)
carrying the whole response and usage. Every event has a ``sequence_number``.
A failure after the start is ``response.failed``.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from polar.ir import ChatRequest, Delta, Finish, FinishReason, ToolCall, ToolKind
from polar.proxy.dialects.openai_errors import error_json
from polar.proxy.dialects.openai_responses.translate import (
    call_item,
    message_item,
    new_id,
    reasoning_item,
    response_json,
)
from polar.proxy.errors import ProxyError


class EventEncoder:
    def __init__(self, request: ChatRequest, *, response_id: str) -> None:
        self._request = request
        self._id = response_id
        self._created = int(time.time())
        self._seq = 0
        self._output: list[dict[str, Any]] = []
        self._open: str | None = None  # "reasoning", "message", or "call:<n>"
        self._item_id = ""
        self._text: list[str] = []
        self._call: dict[str, str] = {}
        self._discarded: set[int] = set()
        self._custom = {t.name for t in request.tools if t.kind is ToolKind.CUSTOM}
        # Whitespace between reasoning and a tool call is template glue: it opens
        # no message item unless real text follows.
        self._blank = ""

    def _event(self, kind: str, data: dict[str, Any]) -> bytes:
        data = {"type": kind, "sequence_number": self._seq, **data}
        self._seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    def _response(
        self, status: str, *, usage: Any = None, finish: FinishReason | None = None
    ) -> dict[str, Any]:
        return response_json(
            self._request,
            response_id=self._id,
            created_at=self._created,
            status=status,
            output=list(self._output),
            usage=usage,
            finish=finish,
        )

    def start(self, prompt_tokens: int) -> bytes:
        response = self._response("in_progress")
        return self._event("response.created", {"response": response}) + self._event(
            "response.in_progress", {"response": response}
        )

    # ---------------------------------------------------------------- items

    @property
    def _index(self) -> int:
        return len(self._output)

    def _added(self, item: dict[str, Any]) -> bytes:
        self._item_id = item["id"]
        return self._event(
            "response.output_item.added", {"output_index": self._index, "item": item}
        )

    def _done(self, item: dict[str, Any]) -> bytes:
        out = self._event("response.output_item.done", {"output_index": self._index, "item": item})
        self._output.append(item)
        self._open = None
        return out

    def _where(self) -> dict[str, Any]:
        return {"item_id": self._item_id, "output_index": self._index}

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        text = "".join(self._text)
        if self._open == "reasoning":
            part = {"type": "reasoning_text", "text": text}
            return (
                self._event(
                    "response.reasoning_text.done",
                    {**self._where(), "content_index": 0, "text": text},
                )
                + self._event(
                    "response.content_part.done",
                    {**self._where(), "content_index": 0, "part": part},
                )
                + self._done(reasoning_item(text, self._item_id, self._request))
            )
        if self._open == "message":
            item = message_item(text, self._item_id, "completed")
            return (
                self._event(
                    "response.output_text.done",
                    {**self._where(), "content_index": 0, "text": text, "logprobs": []},
                )
                + self._event(
                    "response.content_part.done",
                    {**self._where(), "content_index": 0, "part": item["content"][0]},
                )
                + self._done(item)
            )
        index = int(self._open.split(":")[1])
        call = ToolCall(id=self._call["id"], name=self._call["name"], arguments=text)
        status = "incomplete" if index in self._discarded else "completed"
        item = call_item(call, self._item_id, self._request, status)
        out = b""
        if item["type"] == "function_call":
            out += self._event(
                "response.function_call_arguments.done", {**self._where(), "arguments": text}
            )
        elif item["type"] == "custom_tool_call":
            out += self._event(
                "response.custom_tool_call_input.done", {**self._where(), "input": item["input"]}
            )
        if status == "incomplete":
            self._open = None
            return out + self._event(
                "response.output_item.done", {"output_index": self._index, "item": item}
            )
        return out + self._done(item)

    def delta(self, event: Delta) -> bytes:
        out = b""
        if event.reasoning:
            if self._open != "reasoning":
                out += self._close()
                self._open, self._text = "reasoning", []
                out += self._added(
                    {"id": new_id("rs"), "type": "reasoning", "summary": [], "content": []}
                )
                out += self._event(
                    "response.content_part.added",
                    {
                        **self._where(),
                        "content_index": 0,
                        "part": {"type": "reasoning_text", "text": ""},
                    },
                )
            self._text.append(event.reasoning)
            out += self._event(
                "response.reasoning_text.delta",
                {**self._where(), "content_index": 0, "delta": event.reasoning},
            )
        text = event.text
        if text and self._open != "message" and not (self._blank + text).strip():
            self._blank += text
            text = ""
        if text:
            if self._open != "message":
                text, self._blank = self._blank + text, ""
                out += self._close()
                self._open, self._text = "message", []
                item = message_item("", new_id("msg"), "in_progress")
                item["content"] = []
                out += self._added(item)
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                out += self._event(
                    "response.content_part.added",
                    {**self._where(), "content_index": 0, "part": part},
                )
            self._text.append(text)
            out += self._event(
                "response.output_text.delta",
                {**self._where(), "content_index": 0, "delta": text, "logprobs": []},
            )
        for piece in event.tool_calls:
            if piece.discard:
                self._discarded.add(piece.index)
                if self._open == f"call:{piece.index}":
                    out += self._close()
                continue
            key = f"call:{piece.index}"
            if self._open != key:
                out += self._close()
                self._open, self._text = key, []
                self._call = {"id": piece.id or new_id("call"), "name": piece.name or ""}
                call = ToolCall(id=self._call["id"], name=self._call["name"], arguments="")
                item = call_item(call, new_id("fc"), self._request, "in_progress")
                if item["type"] == "custom_tool_call":
                    item["input"] = ""
                out += self._added(item)
            if piece.arguments:
                self._text.append(piece.arguments)
                if self._call["name"] not in self._custom:
                    out += self._event(
                        "response.function_call_arguments.delta",
                        {**self._where(), "delta": piece.arguments},
                    )
        return out

    def finish(self, finish: Finish) -> bytes:
        out = self._close()
        status = "incomplete" if finish.reason is FinishReason.LENGTH else "completed"
        response = self._response(status, usage=finish.usage, finish=finish.reason)
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        return out + self._event(kind, {"response": response})

    def error(self, error: ProxyError) -> bytes:
        response = self._response("failed")
        body = error_json(error)["error"]
        response["error"] = {"code": body["code"] or body["type"], "message": body["message"]}
        return self._close() + self._event("response.failed", {"response": response})
