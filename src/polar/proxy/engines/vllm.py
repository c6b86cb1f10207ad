"""vLLM's OpenAI-compatible chat route with token capture (engine-rendered mode).

vLLM returns what training needs when asked with ``return_token_ids: true``
(prompt ids once, sampled ids per step), ``logprobs: true`` and
``top_logprobs`` (it fills ``logprobs.content`` only when that is set).
Streaming: the first chunk carries ``prompt_token_ids`` and the role; every
later chunk carries the ids sampled since the previous one, with one logprob
entry each, even when the parsers had no text to emit for them.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from typing import Any

import orjson

from polar.ir import (
    ChatRequest,
    Delta,
    EngineEvent,
    Finish,
    FinishReason,
    PromptTokens,
    TokenLogprob,
)
from polar.proxy.engines.base import NO_HEADERS, EngineCall, Headers
from polar.proxy.engines.openai_compat import (
    chat_body,
    delta_from_message,
    finish_reason,
    logprob_details,
    tool_call_deltas,
    usage,
)
from polar.proxy.engines.transport import EngineTransport
from polar.proxy.errors import EngineProtocolError

CHAT_PATH = "/v1/chat/completions"


class VllmChatEngine:
    """Forwards chat requests to vLLM and reads back exact ids and logprobs."""

    name = "vllm"

    def __init__(
        self,
        transport: EngineTransport,
        *,
        model: str,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self._transport = transport
        self._model = model
        self._template_kwargs = dict(template_kwargs or {})

    @property
    def model(self) -> str:
        return self._model

    async def aclose(self) -> None:
        await self._transport.aclose()

    async def count_tokens(self, request: ChatRequest) -> int:
        body = chat_body(
            request,
            model=self._model,
            reasoning_field="reasoning",
            template_kwargs=self._template_kwargs,
        )
        tokenize = {
            "model": self._model,
            "messages": body["messages"],
            "add_generation_prompt": True,
        }
        for key in ("tools", "chat_template_kwargs"):
            if key in body:
                tokenize[key] = body[key]
        reply = await self._transport.post_json("/tokenize", tokenize)
        try:
            return int(reply["count"])
        except (KeyError, TypeError, ValueError):
            raise EngineProtocolError("engine /tokenize reply has no count") from None

    def prepare(self, request: ChatRequest, *, headers: Headers = NO_HEADERS) -> EngineCall:
        body = chat_body(
            request,
            model=self._model,
            reasoning_field="reasoning",
            template_kwargs=self._template_kwargs,
        )
        if request.structured_output is not None:
            body["structured_outputs"] = dict(request.structured_output)
        body["logprobs"] = True
        body["top_logprobs"] = request.top_logprobs or 0
        body["return_token_ids"] = True
        body["stream"] = request.stream
        # Per-token detail (token text, bytes, alternatives) is only built for
        # clients that asked for logprobs; the record needs ids and logprobs only.
        details = request.top_logprobs is not None
        if request.stream:
            body["stream_options"] = {"include_usage": True}
            return EngineCall(body=body, events=self._stream(body, details, headers))
        return EngineCall(body=body, events=self._once(body, details, headers))

    async def _once(
        self, body: dict[str, Any], details: bool, headers: Headers
    ) -> AsyncGenerator[EngineEvent, None]:
        reply = await self._transport.post_json(CHAT_PATH, body, headers)
        for event in parse_reply(reply, details=details):
            yield event

    async def _stream(
        self, body: dict[str, Any], details: bool, headers: Headers
    ) -> AsyncGenerator[EngineEvent, None]:
        reader = StreamReader(details=details)
        async for sse in self._transport.stream_sse(CHAT_PATH, body, headers):
            for event in reader.feed(sse.data):
                yield event
        yield reader.finish()


def _ids_and_logprobs(
    choice: Mapping[str, Any], details: bool
) -> tuple[tuple[int, ...], tuple[TokenLogprob, ...] | None, tuple[float, ...]]:
    ids = tuple(choice.get("token_ids") or ())
    logprobs = choice.get("logprobs")
    content = (logprobs.get("content") if isinstance(logprobs, dict) else None) or ()
    try:
        values = tuple(float(entry["logprob"]) for entry in content)
    except (KeyError, TypeError, ValueError):
        raise EngineProtocolError("engine sent a logprobs entry without a number") from None
    if len(values) != len(ids):
        raise EngineProtocolError(
            f"engine sent {len(ids)} token ids but {len(values)} logprobs; "
            "is it vLLM >= 0.10 with return_token_ids support?"
        )
    return ids, (logprob_details(list(content)) if details else None), values


def parse_reply(reply: Any, *, details: bool = True) -> list[EngineEvent]:
    """A non-streamed vLLM chat completion to IR events."""
    try:
        choice = reply["choices"][0]
        prompt_ids = tuple(reply["prompt_token_ids"])
        message = choice["message"]
    except (KeyError, IndexError, TypeError) as exc:
        raise EngineProtocolError(
            f"vLLM reply lacks {exc}; the gateway asks for return_token_ids, "
            "which needs a vLLM that supports it"
        ) from None
    ids, detail, logprobs = _ids_and_logprobs(choice, details)
    return [
        PromptTokens(prompt_ids),
        delta_from_message(message, token_ids=ids, logprobs=logprobs, details=detail),
        Finish(
            reason=finish_reason(choice.get("finish_reason")),
            usage=usage(
                reply.get("usage"), fallback_prompt=len(prompt_ids), fallback_completion=len(ids)
            ),
            matched_stop=choice.get("stop_reason"),
        ),
    ]


class StreamReader:
    """Turns vLLM chat stream chunks into IR events."""

    def __init__(self, *, details: bool = True) -> None:
        self._details = details
        self._prompt: tuple[int, ...] | None = None
        self._finish: FinishReason | None = None
        self._matched: str | int | None = None
        self._usage: Any = None
        self._completion_tokens = 0
        self._done = False

    def feed(self, data: bytes) -> list[EngineEvent]:
        if data == b"[DONE]":
            self._done = True
            return []
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise EngineProtocolError(f"engine sent a chunk that is not JSON: {exc}") from exc
        if "error" in chunk and "choices" not in chunk:
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else error
            raise EngineProtocolError(f"engine failed mid-stream: {message}")
        events: list[EngineEvent] = []
        if chunk.get("prompt_token_ids") is not None and self._prompt is None:
            self._prompt = tuple(chunk["prompt_token_ids"])
            events.append(PromptTokens(self._prompt))
        if chunk.get("usage") is not None:
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            ids, details, logprobs = _ids_and_logprobs(choice, self._details)
            delta = choice.get("delta") or {}
            text = delta.get("content") or ""
            reasoning = delta.get("reasoning") or delta.get("reasoning_content") or ""
            calls = tool_call_deltas(delta.get("tool_calls"))
            if ids or text or reasoning or calls:
                self._completion_tokens += len(ids)
                events.append(
                    Delta(
                        token_ids=ids,
                        logprobs=logprobs,
                        text=text,
                        reasoning=reasoning,
                        tool_calls=calls,
                        details=details,
                    )
                )
            if choice.get("finish_reason") is not None:
                self._finish = finish_reason(choice["finish_reason"])
                self._matched = choice.get("stop_reason")
        return events

    def finish(self) -> Finish:
        if self._prompt is None:
            raise EngineProtocolError("engine stream never sent prompt_token_ids")
        if self._finish is None:
            raise EngineProtocolError("engine stream ended without a finish_reason")
        if not self._done:
            raise EngineProtocolError("engine stream ended without [DONE]")
        return Finish(
            reason=self._finish,
            usage=usage(
                self._usage,
                fallback_prompt=len(self._prompt),
                fallback_completion=self._completion_tokens,
            ),
            matched_stop=self._matched,
        )
