"""SGLang's OpenAI-compatible chat route with token capture (engine-rendered mode).

SGLang returns prompt ids with ``return_prompt_token_ids: true`` (in
``choices[i].prompt_token_ids``) and the sampled ids with their logprobs in
``choices[i].meta_info.output_token_logprobs`` (``[logprob, token_id, text]``
triples) with ``return_meta_info: true`` and ``logprobs: true``. Newer builds
also put the sampled ids in ``choices[i].token_ids``.

SGLang rejects those flags on streaming requests (HTTP 400, "...is not
supported with streaming"), so in this mode the gateway always calls SGLang
without streaming and replays the finished turn to a streaming client. For
true token streaming from SGLang use token-in/token-out capture, whose
``/generate`` route streams ids.
"""

from __future__ import annotations

from typing import Any

import orjson

from polar.ir import ChatRequest, EngineEvent, Finish, PromptTokens
from polar.proxy.engines.adapter import CompatChatEngine
from polar.proxy.engines.base import NO_HEADERS, EngineCall, Headers
from polar.proxy.engines.openai_compat import (
    delta_from_message,
    finish_reason,
    logprob_details,
    usage,
)
from polar.proxy.engines.replies import (
    array,
    count,
    number,
    obj,
    optional_obj,
    stop_reason,
    token_id,
    token_ids,
)
from polar.proxy.errors import EngineProtocolError


class SglangChatEngine(CompatChatEngine):
    name = "sglang"
    reasoning_field = "reasoning_content"

    def count_body(self, request: ChatRequest) -> None:
        return None  # counted here: nothing is sent

    async def count_tokens(self, request: ChatRequest, *, headers: Headers = NO_HEADERS) -> int:
        """An estimate (about four characters a token): SGLang has no chat-template
        tokenize route; an exact count needs token-in/token-out capture."""
        body = self.chat_body(request)
        return max(1, len(orjson.dumps({"m": body["messages"], "t": body.get("tools")})) // 4)

    def prepare(self, request: ChatRequest, *, headers: Headers = NO_HEADERS) -> EngineCall:
        body = self.chat_body(request)
        constraint = request.structured_output or {}
        for key in ("regex", "ebnf"):  # SGLang's spelling of vLLM's structured outputs
            if key in constraint:
                body[key] = constraint[key]
        body["stream"] = False
        body["logprobs"] = True
        body["top_logprobs"] = request.top_logprobs or 0
        body["return_prompt_token_ids"] = True
        body["return_meta_info"] = True
        body["separate_reasoning"] = True
        return EngineCall(body=body, events=self._once(body, True, headers))

    def reply_events(self, reply: Any, *, details: bool) -> list[EngineEvent]:
        """Per-token detail comes whenever SGLang sends it (``details`` is not needed)."""
        return parse_reply(reply)


def output_triples(meta: dict[str, Any]) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Ids and logprobs from SGLang's ``output_token_logprobs`` (``[logprob, id, text]``)."""
    triples = array(meta.get("output_token_logprobs"), "meta_info.output_token_logprobs")
    ids: list[int] = []
    logprobs: list[float] = []
    for triple in triples:
        entry = array(triple, "an output_token_logprobs entry")
        if len(entry) < 2:
            raise EngineProtocolError("SGLang sent an output_token_logprobs entry without an id")
        logprobs.append(number(entry[0], "a logprob"))
        ids.append(token_id(entry[1], "a token id"))
    return tuple(ids), tuple(logprobs)


def parse_reply(reply: Any) -> list[EngineEvent]:
    """A non-streamed SGLang chat completion (with meta_info) to IR events."""
    choices = array(obj(reply, "a chat completion").get("choices"), "choices")
    if not choices:
        raise EngineProtocolError("SGLang sent a chat completion without choices")
    choice = obj(choices[0], "a choice")
    if choice.get("prompt_token_ids") is None or choice.get("meta_info") is None:
        raise EngineProtocolError(
            "SGLang reply lacks prompt_token_ids or meta_info; the gateway needs an SGLang "
            "with return_prompt_token_ids and return_meta_info (0.5.13 or newer)"
        )
    message = obj(choice.get("message"), "a choice's message")
    prompt_ids = token_ids(choice["prompt_token_ids"], "prompt_token_ids")
    meta = obj(choice["meta_info"], "meta_info")
    ids, logprobs = output_triples(meta)
    if choice.get("token_ids") is not None and token_ids(choice["token_ids"], "token_ids") != ids:
        raise EngineProtocolError("SGLang token_ids disagree with meta_info.output_token_logprobs")
    content = optional_obj(choice.get("logprobs"), "logprobs").get("content")
    details = logprob_details(content) if content is not None else None
    if details is not None and len(details) != len(ids):
        details = None  # SGLang merges identical top entries; ids and logprobs stay exact
    completion_tokens = count(meta.get("completion_tokens", len(ids)), "completion_tokens")
    return [
        PromptTokens(prompt_ids),
        delta_from_message(message, token_ids=ids, logprobs=logprobs, details=details),
        Finish(
            reason=finish_reason(choice.get("finish_reason")),
            usage=usage(
                reply.get("usage"),
                fallback_prompt=len(prompt_ids),
                fallback_completion=completion_tokens,
            ),
            matched_stop=stop_reason(choice.get("matched_stop")),
        ),
    ]
