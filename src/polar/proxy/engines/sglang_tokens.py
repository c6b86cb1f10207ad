"""Token-in/token-out through SGLang's native ``POST /generate``.

``input_ids`` in, ``output_ids`` and ``meta_info.output_token_logprobs``
(``[logprob, token_id, text]`` triples) out, with ``return_logprob: true``;
a client's top alternatives come in ``meta_info.output_top_logprobs`` (per
position, a list of such triples or ``null``), their text with
``return_text_in_logprobs``.
Streams carry the whole output so far in every chunk by default
(``--incremental-streaming-output`` makes them carry only the new part); this
client handles both by counting what it has already passed on.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from polar.ir import Delta, EngineEvent, Finish, TokenLogprob, TopLogprob, Usage
from polar.ir.tokenids import PromptIdList
from polar.proxy.engines.adapter import HttpEngine
from polar.proxy.engines.base import NO_HEADERS, EngineCall, Headers, TokenRequest
from polar.proxy.engines.openai_compat import finish_reason
from polar.proxy.engines.replies import (
    Steps,
    array,
    count,
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
from polar.proxy.engines.sampling import SGLANG_NATIVE_NAMES, sampling_params
from polar.proxy.engines.sglang import output_triples
from polar.proxy.errors import EngineProtocolError

GENERATE_PATH = "/generate"


def generate_body(request: TokenRequest) -> dict[str, Any]:
    params: dict[str, Any] = {
        "skip_special_tokens": False,
        "no_stop_trim": True,
        **sampling_params(request.sampling, SGLANG_NATIVE_NAMES),
    }
    if request.stop_token_ids:
        params["stop_token_ids"] = list(request.stop_token_ids)
    return {
        "input_ids": PromptIdList(request.prompt_ids),
        "sampling_params": params,
        "return_logprob": True,
        "logprob_start_len": -1,
        "top_logprobs_num": request.top_logprobs or 0,
        # The alternatives' text (the sampled tokens' text comes from the gateway's tokenizer).
        **({"return_text_in_logprobs": True} if request.top_logprobs else {}),
        "stream": request.stream,
    }


class SglangTokenEngine(HttpEngine):
    name = "sglang"

    def prepare(self, request: TokenRequest, *, headers: Headers = NO_HEADERS) -> EngineCall:
        body = generate_body(request)
        return EngineCall(body=body, events=self._run(body, headers))

    @guarded
    async def _run(
        self, body: dict[str, Any], headers: Headers
    ) -> AsyncGenerator[EngineEvent, None]:
        sent = 0
        meta: dict[str, Any] = {}
        tops = body["top_logprobs_num"] > 0
        if body["stream"]:
            done = False
            steps = Steps(tops)

            def read(data: bytes) -> list[EngineEvent]:
                nonlocal done, meta, sent
                if done or data == b"[DONE]":
                    done = True
                    return []
                chunk = obj(json_reply(data, "a chunk"), "a chunk")
                if "error" in chunk:
                    raise EngineProtocolError(f"SGLang failed mid-stream: {error_of(chunk)}")
                meta = optional_obj(chunk.get("meta_info"), "meta_info")
                ids, logprobs, details = _new_part(chunk, meta, sent, tops)
                if ids:
                    steps.add(ids, logprobs, details)
                    sent += len(ids)
                return []

            async for event in read_stream(
                self._transport.stream_sse(GENERATE_PATH, body, headers),
                read,
                lambda: done,
                steps.take,
            ):
                yield event
        else:
            reply = obj(await self._transport.post_json(GENERATE_PATH, body, headers), "a reply")
            meta = optional_obj(reply.get("meta_info"), "meta_info")
            ids, logprobs, details = _new_part(reply, meta, 0, tops)
            sent = len(ids)
            yield Delta(token_ids=ids, logprobs=logprobs, details=details)
        reason = meta.get("finish_reason")
        if not reason:
            raise EngineProtocolError("SGLang output ended without a finish_reason")
        cached = meta.get("cached_tokens")
        yield Finish(
            reason=finish_reason(reason),
            usage=Usage(
                prompt_tokens=count(
                    meta.get("prompt_tokens", len(body["input_ids"])), "prompt_tokens"
                ),
                completion_tokens=count(meta.get("completion_tokens", sent), "completion_tokens"),
                cached_tokens=None if cached is None else count(cached, "cached_tokens"),
            ),
            matched_stop=(stop_reason(reason.get("matched")) if isinstance(reason, dict) else None),
        )


def _new_part(
    chunk: dict[str, Any], meta: dict[str, Any], sent: int, tops: bool
) -> tuple[tuple[int, ...], tuple[float, ...], tuple[TokenLogprob, ...] | None]:
    """The ids and logprobs not yet passed on, whether chunks are cumulative or not;
    ``tops``: with each token's alternatives (``output_top_logprobs``)."""
    ids = list(token_ids(chunk.get("output_ids"), "output_ids"))
    triple_ids, triple_logprobs = output_triples(meta)
    triples = list(zip(triple_logprobs, triple_ids, strict=True))
    alternatives = optional_array(meta.get("output_top_logprobs"), "output_top_logprobs")
    total = count(
        meta.get("output_token_logprobs_length", meta.get("completion_tokens", len(ids))),
        "output length",
    )
    if len(ids) == total and total >= sent:  # cumulative (SGLang's default)
        ids, triples = ids[sent:], triples[sent:] if len(triples) == total else triples
        if len(alternatives) == total:
            alternatives = alternatives[sent:]
    if len(triples) != len(ids):
        raise EngineProtocolError(
            f"SGLang sent {len(ids)} new ids but {len(triples)} logprob entries"
        )
    if any(t[1] != i for t, i in zip(triples, ids, strict=True)):
        raise EngineProtocolError("SGLang output_ids disagree with output_token_logprobs")
    logprobs = tuple(t[0] for t in triples)
    details = None
    if tops and ids:
        if len(alternatives) != len(ids):
            raise EngineProtocolError(
                f"SGLang sent {len(ids)} new ids but alternatives for {len(alternatives)}"
            )
        details = tuple(
            TokenLogprob(token="", logprob=value, top=_alternatives(entry))
            for value, entry in zip(logprobs, alternatives, strict=True)
        )
    return tuple(ids), logprobs, details


def _alternatives(entry: Any) -> tuple[TopLogprob, ...]:
    """One position's ``[logprob, token_id, text]`` alternatives (``null``: none)."""
    out = []
    for triple in optional_array(entry, "an output_top_logprobs entry"):
        item = array(triple, "an output_top_logprobs alternative")
        if len(item) < 3:
            raise EngineProtocolError("SGLang sent an alternative without its text")
        out.append(
            TopLogprob(
                token=text(item[2], "an alternative's text"),
                logprob=number(item[0], "an alternative's logprob"),
            )
        )
    return tuple(out)
