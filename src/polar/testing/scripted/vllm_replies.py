"""A scripted turn as vLLM answers it: chat and completions, whole or streamed.

The turn comes as a :class:`~polar.testing.scripted.vllm_wire.Generation`
(ids, logprobs, per-token text); what vLLM's parsers make of it comes from
:mod:`~polar.testing.scripted.vllm_wire`; the bodies and events are
:mod:`polar.proxy.engines.vllm_protocol`'s, in vLLM's full layout.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from polar.proxy.engines import vllm_protocol as wire
from polar.testing.scripted import vllm_wire
from polar.testing.scripted.pacing import Pacing
from polar.testing.scripted.vllm_wire import SYSTEM_FINGERPRINT, Generation
from polar.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class Answer:
    """A request (its JSON ``body`` and rendered ``prompt``) and the turn sampled for it."""

    tokenizer: Tokenizer
    body: dict[str, Any]
    prompt: list[int]
    gen: Generation
    model: str


# ---------------------------------------------------------------- completions (token-in)


def completion_whole(answer: Answer) -> dict[str, Any]:
    gen = answer.gen
    head = wire.head("text_completion", answer.model)
    top = int(answer.body.get("logprobs") or 0)
    return wire.completion(
        head,
        text=gen.text,
        logprobs=vllm_wire.completion_logprobs(answer.tokenizer, gen, 0, len(gen.ids), 0, top),
        finish_reason=gen.finish,
        stop_reason=vllm_wire.stop_reason(gen, list(answer.body.get("stop_token_ids") or ())),
        token_ids=gen.ids,
        prompt_token_ids=answer.prompt,
        full=True,
        fingerprint=SYSTEM_FINGERPRINT,
    )


async def completion_events(answer: Answer, pacing: Pacing) -> AsyncIterator[bytes]:
    gen, body = answer.gen, answer.body
    head = wire.head("text_completion", answer.model)
    stops = list(body.get("stop_token_ids") or ())
    top = int(body.get("logprobs") or 0)
    last = len(gen.ids) - 1
    offset = 0
    async for i in pacing.tokens(len(gen.token_texts)):
        piece = gen.token_texts[i]
        chunk = wire.completion_chunk(
            head,
            text=piece,
            logprobs=vllm_wire.completion_logprobs(answer.tokenizer, gen, i, i + 1, offset, top),
            finish_reason=gen.finish if i == last else None,
            stop_reason=vllm_wire.stop_reason(gen, stops) if i == last else None,
            prompt_token_ids=answer.prompt if i == 0 else None,
            token_ids=[gen.ids[i]],
        )
        offset += len(piece)
        yield wire.event(chunk)
    if (body.get("stream_options") or {}).get("include_usage"):
        usage = wire.usage(len(answer.prompt), len(gen.ids))
        yield wire.event(wire.usage_event(head, usage, full=True, fingerprint=SYSTEM_FINGERPRINT))
    yield wire.DONE_EVENT


# ---------------------------------------------------------------- chat


def _details(answer: Answer, i: int) -> dict[str, Any]:
    top = int(answer.body.get("top_logprobs") or 0)
    return vllm_wire.token_detail(answer.tokenizer, answer.gen.ids[i], answer.gen.logprobs[i], top)


def chat_whole(answer: Answer, *, tools_offered: bool) -> dict[str, Any]:
    gen, body = answer.gen, answer.body
    parsed = vllm_wire.parse_whole(gen, tools_offered=tools_offered)
    message = wire.chat_message(
        parsed.content, parsed.reasoning, parsed.tool_calls if tools_offered else None
    )
    want_ids = bool(body.get("return_token_ids"))
    details = [_details(answer, i) for i in range(len(gen.ids))]
    usage = wire.usage(
        len(answer.prompt),
        len(gen.ids),
        prompt_tokens_details=None,
        completion_tokens_details={"reasoning_tokens": parsed.reasoning_tokens},
    )
    return wire.chat_completion(
        wire.head("chat.completion", answer.model),
        message=message,
        logprobs=details if body.get("logprobs") else None,
        finish_reason="tool_calls" if parsed.tool_calls and gen.finish == "stop" else gen.finish,
        token_ids=gen.ids if want_ids else None,
        prompt_token_ids=answer.prompt if want_ids else None,
        usage=usage,
        fingerprint=SYSTEM_FINGERPRINT,
    )


async def chat_events(
    answer: Answer, *, tools_offered: bool, pacing: Pacing
) -> AsyncIterator[bytes]:
    gen, body = answer.gen, answer.body
    head = wire.head("chat.completion.chunk", answer.model)
    want_ids = bool(body.get("return_token_ids"))
    await pacing.pause()
    first = wire.chat_first_chunk(head, prompt_token_ids=answer.prompt if want_ids else None)
    yield wire.event(first)
    parser = vllm_wire.StreamParser(tools_offered=tools_offered)
    last = len(gen.ids) - 1
    async for i in pacing.tokens(len(gen.token_texts)):
        delta = parser.feed(gen.token_texts[i])
        finish = None
        if i == last:
            finish = "tool_calls" if parser.tools_streamed and gen.finish == "stop" else gen.finish
        chunk = wire.chat_chunk(
            head,
            delta=delta,
            logprobs=[_details(answer, i)] if body.get("logprobs") else None,
            finish_reason=finish,
            token_ids=[gen.ids[i]] if want_ids else None,
        )
        yield wire.event(chunk)
    if (body.get("stream_options") or {}).get("include_usage"):
        usage = wire.usage(
            len(answer.prompt),
            len(gen.ids),
            completion_tokens_details={"reasoning_tokens": parser.reasoning_tokens},
        )
        yield wire.event(wire.usage_event(head, usage, full=True, fingerprint=SYSTEM_FINGERPRINT))
    yield wire.DONE_EVENT
