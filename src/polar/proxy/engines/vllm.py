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

from polar.ir import (
    ChatRequest,
    EngineEvent,
    Finish,
    FinishReason,
    JsonObject,
    PromptTokens,
    TokenLogprob,
)
from polar.proxy.engines.adapter import CHAT_PATH, CompatChatEngine
from polar.proxy.engines.base import NO_HEADERS, EngineCall, Headers
from polar.proxy.engines.openai_compat import (
    delta_from_message,
    finish_reason,
    logprob_details,
    tool_call_deltas,
    usage,
)
from polar.proxy.engines.replies import (
    Steps,
    array,
    error_of,
    guarded,
    json_reply,
    number,
    obj,
    optional_array,
    optional_obj,
    read_stream,
    stop_reason,
    text,
    token_ids,
)
from polar.proxy.engines.vllm_protocol import DONE, TOKENIZE_PATH
from polar.proxy.errors import EngineProtocolError


class VllmChatEngine(CompatChatEngine):
    """Forwards chat requests to vLLM and reads back exact ids and logprobs."""

    name = "vllm"
    reasoning_field = "reasoning"

    def count_body(self, request: ChatRequest) -> JsonObject:
        body = self.chat_body(request)
        tokenize: dict[str, Any] = {
            "model": self._model,
            "messages": body["messages"],
            "add_generation_prompt": True,
        }
        for key in ("tools", "chat_template_kwargs"):
            if key in body:
                tokenize[key] = body[key]
        return tokenize

    async def count_tokens(self, request: ChatRequest, *, headers: Headers = NO_HEADERS) -> int:
        reply = await self._transport.post_json(
            TOKENIZE_PATH, self.count_body(request), headers, idempotent=True
        )
        count = reply.get("count") if isinstance(reply, dict) else None
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise EngineProtocolError(f"engine {TOKENIZE_PATH} reply has no count")
        return count

    def prepare(self, request: ChatRequest, *, headers: Headers = NO_HEADERS) -> EngineCall:
        body = self.chat_body(request)
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

    def reply_events(self, reply: Any, *, details: bool) -> list[EngineEvent]:
        return parse_reply(reply, details=details)

    @guarded
    async def _stream(
        self, body: dict[str, Any], details: bool, headers: Headers
    ) -> AsyncGenerator[EngineEvent, None]:
        reader = StreamReader(details=details)
        async for event in read_stream(
            self._transport.stream_sse(CHAT_PATH, body, headers),
            reader.feed,
            reader.done,
            reader.take,
        ):
            yield event
        yield reader.finish()


def _ids_and_logprobs(
    choice: Mapping[str, Any], details: bool
) -> tuple[tuple[int, ...], tuple[TokenLogprob, ...] | None, tuple[float, ...]]:
    ids = token_ids(choice.get("token_ids"), "token_ids")
    logprobs = optional_obj(choice.get("logprobs"), "logprobs")
    content = optional_array(logprobs.get("content"), "logprobs.content")
    detail = logprob_details(content) if details else None
    values = (
        tuple(d.logprob for d in detail)
        if detail is not None
        else tuple(
            number(obj(entry, "a logprobs entry").get("logprob"), "a logprob") for entry in content
        )
    )
    if len(values) != len(ids):
        raise EngineProtocolError(
            f"engine sent {len(ids)} token ids but {len(values)} logprobs; "
            "is it vLLM >= 0.10 with return_token_ids support?"
        )
    return ids, detail, values


def parse_reply(reply: Any, *, details: bool = True) -> list[EngineEvent]:
    """A non-streamed vLLM chat completion to IR events."""
    reply = obj(reply, "a chat completion")
    choices = array(reply.get("choices"), "choices")
    if not choices:
        raise EngineProtocolError("engine sent a chat completion without choices")
    choice = obj(choices[0], "a choice")
    if reply.get("prompt_token_ids") is None:
        raise EngineProtocolError(
            "vLLM reply lacks 'prompt_token_ids'; the gateway asks for return_token_ids, "
            "which needs a vLLM that supports it"
        )
    prompt_ids = token_ids(reply["prompt_token_ids"], "prompt_token_ids")
    message = obj(choice.get("message"), "a choice's message")
    ids, detail, logprobs = _ids_and_logprobs(choice, details)
    return [
        PromptTokens(prompt_ids),
        delta_from_message(message, token_ids=ids, logprobs=logprobs, details=detail),
        Finish(
            reason=finish_reason(choice.get("finish_reason")),
            usage=usage(
                reply.get("usage"), fallback_prompt=len(prompt_ids), fallback_completion=len(ids)
            ),
            matched_stop=stop_reason(choice.get("stop_reason")),
        ),
    ]


class StreamReader:
    """Turns vLLM chat stream chunks into IR events.

    The steps :meth:`feed` reads are gathered and :meth:`take` hands them on as
    one delta (a network read's worth: see :func:`~polar.proxy.engines.replies.read_stream`);
    an event that is not a step comes out of :meth:`feed` after the steps before it.
    """

    def __init__(self, *, details: bool = True) -> None:
        self._details = details
        self._prompt: tuple[int, ...] | None = None
        self._finish: FinishReason | None = None
        self._matched: str | int | None = None
        self._usage: Any = None
        self._completion_tokens = 0
        self._done = False
        self._steps = Steps(details)

    def feed(self, data: bytes) -> list[EngineEvent]:
        if data == DONE:
            self._done = True
            return []
        chunk = obj(json_reply(data, "a chunk"), "a chunk")
        if "error" in chunk and "choices" not in chunk:
            raise EngineProtocolError(f"engine failed mid-stream: {error_of(chunk)}")
        events: list[EngineEvent] = []
        if chunk.get("prompt_token_ids") is not None and self._prompt is None:
            self._prompt = token_ids(chunk["prompt_token_ids"], "prompt_token_ids")
            events = [*self.take(), PromptTokens(self._prompt)]
        if chunk.get("usage") is not None:
            self._usage = chunk["usage"]
        for choice in optional_array(chunk.get("choices"), "choices"):
            choice = obj(choice, "a choice")
            ids, details, logprobs = _ids_and_logprobs(choice, self._details)
            delta = optional_obj(choice.get("delta"), "a delta")
            content = text(delta.get("content"), "delta content")
            reasoning = text(
                delta.get("reasoning") or delta.get("reasoning_content"), "delta reasoning"
            )
            calls = tool_call_deltas(delta.get("tool_calls"))
            if ids or content or reasoning or calls:
                self._completion_tokens += len(ids)
                self._steps.add(ids, logprobs, details, content, reasoning, calls)
            if choice.get("finish_reason") is not None:
                self._finish = finish_reason(choice["finish_reason"])
                self._matched = stop_reason(choice.get("stop_reason"))
        return events

    def take(self) -> list[EngineEvent]:
        """The steps fed since the last take, as one delta (none: nothing)."""
        return self._steps.take()

    def done(self) -> bool:
        """The engine sent its end-of-stream marker."""
        return self._done

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
