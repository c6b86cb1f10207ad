"""How SGLang reports a chat generation, reproduced for the scripted engine.

SGLang cannot run on this machine (its wheels are CUDA-only), so this follows
SGLang's server code (``serving_chat.py``, ``protocol.py``, ``io_struct.py``
of the 0.5.13+ line) rather than a live capture:

* non-streaming ``/v1/chat/completions`` with ``return_prompt_token_ids`` puts
  the prompt ids in ``choices[i].prompt_token_ids``; with ``return_meta_info``
  and ``logprobs`` the sampled ids come as ``meta_info.output_token_logprobs``
  triples ``[logprob, token_id, text]``; ``content`` is ``""`` rather than null;
  ``matched_stop`` holds the EOS id (null for tool calls and length);
* those flags are refused on streaming requests with HTTP 400 and a flat
  ``{"object": "error", ...}`` body;
* the id is a bare 32-hex uuid, tool call ids are ``call_`` + 24 hex;
* ``POST /update_weights_from_disk`` (``http_server.py``; fields of
  ``UpdateWeightFromDiskReqInput`` in ``io_struct.py``: ``model_path``
  required, ``load_format``, ``abort_all_requests``, ``weight_version``, ...)
  answers ``{"success", "message", "num_paused_requests"}``, 200 when the
  weights loaded ("Succeeded to update model weights.") and 400 when they did
  not (the loader's "Failed to get weights iterator: ..." and the old weights
  kept); a missing ``model_path`` is FastAPI's 422. A given ``weight_version``
  becomes the server's, reported by ``GET /model_info`` (``/get_model_info``
  on older servers) and in every reply's ``meta_info``. The scripted model has
  no weights to swap: the fake checks the directory as SGLang's loader would
  (safetensors files and a ``config.json``) and records the update.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson

from polar.testing.scripted import vllm_wire
from polar.testing.scripted.pacing import Pacing
from polar.tokenizer import Tokenizer

STREAM_FLAG_ERRORS = {
    "return_prompt_token_ids": "return_prompt_token_ids is not supported with streaming. "
    "Please set stream=false when using return_prompt_token_ids=true.",
    "return_token_ids": "return_token_ids is not supported with streaming on "
    "/v1/chat/completions. Please set stream=false when using return_token_ids=true.",
    "return_meta_info": "return_meta_info is not supported with streaming. "
    "Please set stream=false when using return_meta_info=true.",
}


def error_body(message: str, kind: str, status: int) -> dict[str, Any]:
    return {"object": "error", "message": message, "type": kind, "param": None, "code": status}


def weights_update(body: Any, current: str) -> tuple[int, dict[str, Any], str]:
    """(status, reply, weight version afterwards) for ``POST /update_weights_from_disk``."""
    if not isinstance(body, dict) or not isinstance(body.get("model_path"), str):
        detail = [{"type": "missing", "loc": ["body", "model_path"], "msg": "Field required"}]
        return 422, {"detail": detail}, current
    path = Path(body["model_path"])
    weights = sorted(path.glob("*.safetensors")) if path.is_dir() else []
    if not weights or not (path / "config.json").is_file():
        message = (
            "Failed to get weights iterator: "
            f"Cannot find any model weights with `{body['model_path']}`."
        )
        return 400, {"success": False, "message": message, "num_paused_requests": 0}, current
    version = body.get("weight_version")
    after = str(version) if version is not None else current
    reply = {
        "success": True,
        "message": "Succeeded to update model weights.",
        "num_paused_requests": 0,
    }
    return 200, reply, after


def model_info(model_path: str, weight_version: str) -> dict[str, Any]:
    """``GET /model_info`` (the fields a client reads)."""
    return {
        "model_path": model_path,
        "tokenizer_path": model_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": weight_version,
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
    }


def stream_flag_error(body: dict[str, Any]) -> str | None:
    if not body.get("stream"):
        return None
    for flag, message in STREAM_FLAG_ERRORS.items():
        if body.get(flag):
            return message
    return None


def _entry(tokenizer: Tokenizer, token_id: int, logprob: float, top: int) -> dict[str, Any]:
    detail = vllm_wire.token_detail(tokenizer, token_id, logprob, top)
    return {
        "token": detail["token"],
        "bytes": detail["bytes"],
        "logprob": detail["logprob"],
        "top_logprobs": [
            {"token": t["token"], "bytes": t["bytes"], "logprob": t["logprob"]}
            for t in detail["top_logprobs"]
        ],
    }


def _chat_logprobs(tokenizer: Tokenizer, gen: vllm_wire.Generation, top: int) -> dict[str, Any]:
    entries = [_entry(tokenizer, t, lp, top) for t, lp in zip(gen.ids, gen.logprobs, strict=True)]
    return {"content": entries}


def _finish(gen: vllm_wire.Generation, has_calls: bool) -> dict[str, Any]:
    """A chat reply's ``meta_info.finish_reason`` (``matched``: the EOS id on a stop)."""
    if has_calls:
        return {"type": "tool_calls", "matched": None}
    if gen.finish == "stop":
        return {"type": "stop", "matched": gen.eos_id}
    return {"type": "length", "length": len(gen.ids)}


def _chat_meta(
    tokenizer: Tokenizer,
    body: dict[str, Any],
    prompt: list[int],
    gen: vllm_wire.Generation,
    *,
    rid: str,
    finish: dict[str, Any],
    reasoning_tokens: int,
    weight_version: str,
) -> dict[str, Any]:
    """A chat reply's ``meta_info`` (``return_meta_info``)."""
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": len(prompt),
        "weight_version": weight_version,
        "num_retractions": 0,
    }
    if body.get("logprobs"):
        texts = [tokenizer.decode([t], skip_special_tokens=False) for t in gen.ids]
        meta["input_token_logprobs"] = [[None, prompt[-1], None]]
        meta["output_token_logprobs"] = [
            [lp, t, text] for lp, t, text in zip(gen.logprobs, gen.ids, texts, strict=True)
        ]
        meta["output_token_logprobs_length"] = len(gen.ids)
    meta.update(
        {
            "reasoning_tokens": reasoning_tokens,
            "completion_tokens": len(gen.ids),
            "cached_tokens": 0,
            "e2e_latency": 0.001,
        }
    )
    return meta


def whole_response(
    tokenizer: Tokenizer,
    body: dict[str, Any],
    prompt: list[int],
    gen: vllm_wire.Generation,
    *,
    tools_offered: bool,
    model: str,
    weight_version: str = "default",
) -> dict[str, Any]:
    parsed = vllm_wire.parse_whole(gen, tools_offered=tools_offered)
    rid = secrets.token_hex(16)
    calls = [
        {
            "id": f"call_{secrets.token_hex(12)}",
            "index": i,
            "type": "function",
            "function": call["function"],
        }
        for i, call in enumerate(parsed.tool_calls)
    ]
    finish = _finish(gen, bool(calls))
    top = int(body.get("top_logprobs") or 0)
    choice: dict[str, Any] = {
        "index": 0,
        "message": {
            "role": "assistant",
            "content": parsed.content or "",
            "reasoning_content": parsed.reasoning,
            "tool_calls": calls or None,
        },
        "logprobs": _chat_logprobs(tokenizer, gen, top) if body.get("logprobs") else None,
        "finish_reason": finish["type"],
        "matched_stop": finish.get("matched"),
    }
    if body.get("return_prompt_token_ids") or body.get("return_token_ids"):
        choice["prompt_token_ids"] = prompt
    if body.get("return_token_ids"):
        choice["token_ids"] = gen.ids
    if body.get("return_meta_info"):
        choice["meta_info"] = _chat_meta(
            tokenizer,
            body,
            prompt,
            gen,
            rid=rid,
            finish=finish,
            reasoning_tokens=parsed.reasoning_tokens,
            weight_version=weight_version,
        )
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": len(prompt),
            "total_tokens": len(prompt) + len(gen.ids),
            "completion_tokens": len(gen.ids),
            "prompt_tokens_details": None,
            "reasoning_tokens": parsed.reasoning_tokens,
        },
        "metadata": {"weight_version": weight_version},
    }


def generate_meta(
    gen: vllm_wire.Generation,
    prompt: list[int],
    upto: int,
    rid: str,
    *,
    final: bool,
    weight_version: str = "default",
    top: int = 0,
    tokenizer: Tokenizer | None = None,
    with_text: bool = False,
) -> dict[str, Any]:
    """``meta_info`` of SGLang's ``/generate`` after ``upto`` tokens (cumulative).
    ``top``: ``top_logprobs_num`` (``output_top_logprobs``: per position, the
    sampled token first, then made-up alternatives); ``with_text``:
    ``return_text_in_logprobs`` (token texts in the triples, else ``None``)."""
    if with_text and tokenizer is None:
        raise ValueError("return_text_in_logprobs needs the tokenizer")
    texts = tokenizer if with_text else None
    if not final:
        finish: dict[str, Any] | None = None
    elif gen.finish == "stop":
        finish = {"type": "stop", "matched": gen.ids[-1]}
    else:
        finish = {"type": "length", "length": len(gen.ids)}
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": len(prompt),
        "weight_version": weight_version,
        "num_retractions": 0,
        "input_token_logprobs": [[None, prompt[-1], None]],
        "output_token_logprobs": [
            [lp, t, None if texts is None else _text(texts, t)]
            for lp, t in zip(gen.logprobs[:upto], gen.ids[:upto], strict=True)
        ],
        "output_token_logprobs_length": upto,
        "completion_tokens": upto,
        "cached_tokens": 0,
    }
    if top > 0:
        meta["output_top_logprobs"] = [
            [
                [lp - 1.5 * k, alt, None if texts is None else _text(texts, alt)]
                for k, alt in enumerate([t, *((t + 7919 * k) % 151643 for k in range(1, top))])
            ]
            for lp, t in zip(gen.logprobs[:upto], gen.ids[:upto], strict=True)
        ]
    if final:
        meta["e2e_latency"] = 0.001
    return meta


def _logprob_options(body: dict[str, Any], tokenizer: Tokenizer) -> dict[str, Any]:
    """:func:`generate_meta`'s logprob arguments for a ``/generate`` request."""
    return {
        "top": int(body.get("top_logprobs_num") or 0) if body.get("return_logprob") else 0,
        "tokenizer": tokenizer,
        "with_text": bool(body.get("return_text_in_logprobs")),
    }


def generate_whole(
    tokenizer: Tokenizer,
    gen: vllm_wire.Generation,
    prompt: list[int],
    body: dict[str, Any],
    *,
    weight_version: str,
) -> dict[str, Any]:
    """SGLang's reply to a non-streamed ``POST /generate``."""
    meta = generate_meta(
        gen,
        prompt,
        len(gen.ids),
        secrets.token_hex(16),
        final=True,
        weight_version=weight_version,
        **_logprob_options(body, tokenizer),
    )
    return {"text": gen.text, "output_ids": gen.ids, "meta_info": meta}


async def generate_events(
    tokenizer: Tokenizer,
    gen: vllm_wire.Generation,
    prompt: list[int],
    body: dict[str, Any],
    *,
    weight_version: str,
    pacing: Pacing,
) -> AsyncIterator[bytes]:
    """SGLang's stream for ``POST /generate``: cumulative text, ids and ``meta_info``."""
    rid = secrets.token_hex(16)
    options = _logprob_options(body, tokenizer)
    async for i in pacing.tokens(len(gen.ids)):
        meta = generate_meta(
            gen,
            prompt,
            i + 1,
            rid,
            final=i == len(gen.ids) - 1,
            weight_version=weight_version,
            **options,
        )
        chunk = {
            "text": "".join(gen.token_texts[: i + 1]),
            "output_ids": gen.ids[: i + 1],
            "meta_info": meta,
        }
        yield b"data: " + orjson.dumps(chunk) + b"\n\n"
    yield b"data: [DONE]\n\n"


def _text(tokenizer: Tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False)
