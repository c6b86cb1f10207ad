"""Checks that streamed replies follow each provider's event grammar.

Every event is validated against the provider's own SDK type (the official
``anthropic`` and ``openai`` packages), and the order of events is checked
against the sequence the providers document.
"""

from __future__ import annotations

import json
from typing import Any

from anthropic.types import Message as AnthropicMessage
from anthropic.types import RawMessageStreamEvent
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

_ANTHROPIC = TypeAdapter(RawMessageStreamEvent)
_RESPONSES = TypeAdapter(ResponseStreamEvent)


def sse_events(text: str) -> list[tuple[str | None, dict[str, Any]]]:
    """``(event name, data)`` pairs of an SSE body."""
    out = []
    for block in text.split("\n\n"):
        name, data = None, []
        for line in block.splitlines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        if data:
            out.append((name, json.loads("\n".join(data))))
    return out


def check_anthropic_stream(events: list[tuple[str | None, dict[str, Any]]]) -> dict[str, Any]:
    """Validate the stream; return the message it adds up to."""
    kinds = [e[1]["type"] for e in events if e[1]["type"] != "ping"]
    assert kinds[0] == "message_start", kinds
    assert kinds[-2:] == ["message_delta", "message_stop"], kinds
    message: dict[str, Any] = {}
    blocks: list[dict[str, Any]] = []
    open_index: int | None = None
    json_parts: list[str] = []
    for name, data in events:
        assert name == data["type"], (name, data)
        _ANTHROPIC.validate_python(data)
        kind = data["type"]
        if kind == "message_start":
            message = dict(data["message"])
        elif kind == "content_block_start":
            assert open_index is None, "a block opened before the previous one stopped"
            assert data["index"] == len(blocks)
            open_index = data["index"]
            blocks.append(dict(data["content_block"]))
            json_parts = []
        elif kind == "content_block_delta":
            assert data["index"] == open_index
            block, delta = blocks[-1], data["delta"]
            allowed = {
                "text": {"text_delta"},
                "thinking": {"thinking_delta", "signature_delta"},
                "tool_use": {"input_json_delta"},
            }[block["type"]]
            assert delta["type"] in allowed, (block["type"], delta["type"])
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            else:
                json_parts.append(delta["partial_json"])
        elif kind == "content_block_stop":
            assert data["index"] == open_index
            if blocks[-1]["type"] == "tool_use":
                blocks[-1]["input"] = json.loads("".join(json_parts) or "{}")
                assert isinstance(blocks[-1]["input"], dict)
            if blocks[-1]["type"] == "thinking":
                assert blocks[-1]["signature"], "thinking blocks end with a signature"
            open_index = None
        elif kind == "message_delta":
            assert open_index is None, "message_delta while a block is open"
            message["stop_reason"] = data["delta"]["stop_reason"]
            message["stop_sequence"] = data["delta"]["stop_sequence"]
            message["usage"] = {**message["usage"], **data["usage"]}
    message["content"] = blocks
    AnthropicMessage.model_validate(message)
    return message


def check_responses_stream(events: list[tuple[str | None, dict[str, Any]]]) -> dict[str, Any]:
    """Validate the stream; return the final response object."""
    kinds = [data["type"] for _, data in events]
    assert kinds[:2] == ["response.created", "response.in_progress"], kinds
    assert kinds[-1] in ("response.completed", "response.incomplete"), kinds
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    done: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for name, data in events:
        assert name == data["type"]
        _RESPONSES.validate_python(data)
        kind = data["type"]
        if kind == "response.output_item.added":
            assert current is None, "an item was added before the previous one was done"
            assert data["output_index"] == len(done)
            current = data["item"]
        elif kind == "response.output_item.done":
            assert current is not None and data["item"]["id"] == current["id"]
            if data["item"].get("status") != "incomplete":
                done.append(data["item"])
            current = None
        elif "item_id" in data:
            assert current is not None and data["item_id"] == current["id"], kind
            assert data["output_index"] == len(done)
    final = events[-1][1]["response"]
    Response.model_validate(final)
    assert [item["id"] for item in final["output"]] == [item["id"] for item in done]
    return dict(final)


def gemini_events(text: str) -> list[dict[str, Any]]:
    """The data of each event of a Gemini SSE body (``\\r\\n\\r\\n`` between events)."""
    return [data for _, data in sse_events(text.replace("\r\n", "\n"))]


def check_gemini_stream(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Validate a ``streamGenerateContent?alt=sse`` stream (Google's documented
    ``GenerateContentResponse`` chunks: one candidate, a ``model`` content, the
    finish reason and usage on the last chunk only); return the response it adds
    up to, its parts joined as the Gemini SDKs join them."""
    assert events, "an empty stream"
    parts: list[dict[str, Any]] = []
    for index, chunk in enumerate(events):
        last = index == len(events) - 1
        assert set(chunk) <= {"candidates", "usageMetadata", "modelVersion", "responseId"}, chunk
        assert isinstance(chunk["modelVersion"], str) and isinstance(chunk["responseId"], str)
        (candidate,) = chunk["candidates"]
        assert candidate["index"] == 0 and candidate["content"]["role"] == "model", chunk
        assert ("finishReason" in candidate) == last, (index, chunk)
        assert ("usageMetadata" in chunk) == last, (index, chunk)
        for part in candidate["content"]["parts"]:
            assert len(set(part) - {"thought"}) == 1, part
            if "text" in part:
                assert isinstance(part["text"], str) and part["text"], part
            else:
                call = part["functionCall"]
                assert isinstance(call["name"], str) and isinstance(call["args"], dict), part
            last_part = parts[-1] if parts else {}
            if (
                "text" in part
                and "text" in last_part
                and part.get("thought") == last_part.get("thought")
            ):
                parts[-1] = {**last_part, "text": last_part["text"] + part["text"]}
            else:
                parts.append(part)
    usage = events[-1]["usageMetadata"]
    assert usage["totalTokenCount"] == usage["promptTokenCount"] + usage[
        "candidatesTokenCount"
    ] + usage.get("thoughtsTokenCount", 0), usage
    final = events[-1]["candidates"][0]
    return {
        **events[-1],
        "candidates": [{**final, "content": {"role": "model", "parts": parts}}],
    }
