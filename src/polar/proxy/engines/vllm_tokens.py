"""Token-in/token-out through vLLM's completions route (``POST /v1/completions``).

The prompt is a list of token ids, so vLLM applies no chat template; with
``return_token_ids: true`` and ``logprobs: 0`` every reply (or stream chunk)
carries the sampled ids and one logprob each (``logprobs.token_logprobs``).
The embedded CPU engine serves the same route, so this client drives both.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from polar.ir import Delta, EngineEvent, Finish, FinishReason, TokenLogprob, TopLogprob
from polar.ir.tokenids import PromptIdList
from polar.proxy.engines.adapter import HttpEngine
from polar.proxy.engines.base import NO_HEADERS, EngineCall, Headers, TokenRequest
from polar.proxy.engines.openai_compat import finish_reason, usage
from polar.proxy.engines.replies import (
    Steps,
    array,
    error_of,
    guarded,
    json_reply,
    number,
    numbers,
    obj,
    optional_array,
    optional_obj,
    read_stream,
    stop_reason,
    text,
    token_ids,
)
from polar.proxy.engines.sampling import sampling_params
from polar.proxy.engines.transport import Transport
from polar.proxy.engines.vllm_protocol import COMPLETIONS_PATH, DONE
from polar.proxy.errors import EngineProtocolError


def completion_body(request: TokenRequest, *, model: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "prompt": PromptIdList(request.prompt_ids),
        "stream": request.stream,
        "logprobs": request.top_logprobs or 0,
        "return_token_ids": True,
        "skip_special_tokens": False,
    }
    body.update(sampling_params(request.sampling))
    if request.stop_token_ids:
        body["stop_token_ids"] = list(request.stop_token_ids)
    if request.stream:
        body["stream_options"] = {"include_usage": True}
    return body


def _choice_delta(choice: dict[str, Any], *, details: bool) -> Delta:
    ids, values, detail = _choice_parts(choice, details=details)
    return Delta(token_ids=ids, logprobs=values, details=detail)


def _choice_parts(
    choice: dict[str, Any], *, details: bool
) -> tuple[tuple[int, ...], tuple[float, ...], tuple[TokenLogprob, ...] | None]:
    """A choice's ids, their logprobs and (``details``) per-token detail."""
    ids = token_ids(choice.get("token_ids"), "token_ids")
    logprobs = optional_obj(choice.get("logprobs"), "logprobs")
    values = numbers(optional_array(logprobs.get("token_logprobs"), "token_logprobs"), "a logprob")
    if len(values) != len(ids):
        raise EngineProtocolError(
            f"engine sent {len(ids)} token ids but {len(values)} logprobs on {COMPLETIONS_PATH}"
        )
    detail = None
    if details:
        tokens = optional_array(logprobs.get("tokens"), "logprobs.tokens") or [""] * len(ids)
        if not {*map(type, tokens)} <= {str, type(None)}:
            for token in tokens:
                text(token, "a logprobs token")
        tops = optional_array(logprobs.get("top_logprobs"), "top_logprobs") or [None] * len(ids)
        detail = tuple(
            TokenLogprob(token=token or "", logprob=value, top=() if top is None else _top(top))
            for token, value, top in zip(tokens, values, tops, strict=False)
        )
    return ids, values, detail


def _top(entry: Any) -> tuple[TopLogprob, ...]:
    return tuple(
        TopLogprob(token=str(k), logprob=number(v, "a top logprob"))
        for k, v in obj(entry, "a top logprobs entry").items()
    )


def _first_choice(reply: Any) -> dict[str, Any]:
    choices = array(obj(reply, "a completion").get("choices"), "choices")
    if not choices:
        raise EngineProtocolError(f"engine reply on {COMPLETIONS_PATH} has no choices")
    return obj(choices[0], "a choice")


class VllmTokenEngine(HttpEngine):
    """vLLM (or the embedded engine) driven with token ids."""

    def __init__(self, transport: Transport, *, model: str, name: str = "vllm") -> None:
        super().__init__(transport, model=model)
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def prepare(self, request: TokenRequest, *, headers: Headers = NO_HEADERS) -> EngineCall:
        body = completion_body(request, model=self._model)
        # Per-token detail only for the alternatives: the capture makes the rest
        # (token text and bytes) from the ids with its own tokenizer.
        details = bool(request.top_logprobs)
        events = (
            self._stream(body, details, headers)
            if request.stream
            else self._once(body, details, headers)
        )
        return EngineCall(body=body, events=events)

    @guarded
    async def _once(
        self, body: dict[str, Any], details: bool, headers: Headers
    ) -> AsyncGenerator[EngineEvent, None]:
        reply = await self._transport.post_json(COMPLETIONS_PATH, body, headers)
        choice = _first_choice(reply)
        delta = _choice_delta(choice, details=details)
        reason = finish_reason(choice.get("finish_reason"))
        yield delta
        yield Finish(
            reason=reason,
            usage=usage(
                reply.get("usage"),
                fallback_prompt=len(body["prompt"]),
                fallback_completion=len(delta.token_ids),
            ),
            matched_stop=stop_reason(choice.get("stop_reason")),
        )

    @guarded
    async def _stream(
        self, body: dict[str, Any], details: bool, headers: Headers
    ) -> AsyncGenerator[EngineEvent, None]:
        reason: FinishReason | None = None
        matched: str | int | None = None
        raw_usage: Any = None
        produced = 0
        done = False
        steps = Steps(details)

        def read(data: bytes) -> list[EngineEvent]:
            nonlocal done, raw_usage, produced, reason, matched
            if done or data == DONE:
                done = True
                return []
            chunk = obj(json_reply(data, "a chunk"), "a chunk")
            if "error" in chunk and "choices" not in chunk:
                raise EngineProtocolError(f"engine failed mid-stream: {error_of(chunk)}")
            if chunk.get("usage") is not None:
                raw_usage = chunk["usage"]
            for choice in optional_array(chunk.get("choices"), "choices"):
                choice = obj(choice, "a choice")
                ids, values, detail = _choice_parts(choice, details=details)
                steps.add(ids, values, detail)
                produced += len(ids)
                if choice.get("finish_reason") is not None:
                    reason = finish_reason(choice["finish_reason"])
                    matched = stop_reason(choice.get("stop_reason"))
            return []

        async for event in read_stream(
            self._transport.stream_sse(COMPLETIONS_PATH, body, headers),
            read,
            lambda: done,
            steps.take,
        ):
            yield event
        if reason is None or not done:
            raise EngineProtocolError(f"engine stream on {COMPLETIONS_PATH} ended before finishing")
        yield Finish(
            reason=reason,
            usage=usage(
                raw_usage, fallback_prompt=len(body["prompt"]), fallback_completion=produced
            ),
            matched_stop=matched,
        )
