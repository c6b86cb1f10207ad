"""The gateway in front of SGLang.

SGLang cannot run here (its wheels are CUDA-only), so these tests use the
scripted engine's SGLang personality: a real HTTP server that answers with
SGLang's response shapes as its server code defines them (see
``polar.testing.scripted.sglang_wire``). That is a faithful fake, not
SGLang itself.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from polar.ir import FinishReason, RecordStatus
from polar.testing.scripted import Script, ScriptedEngine
from polar.testing.scripted.vllm_wire import logprob_for

from support.stack import BASH_TOOL

USER = [{"role": "user", "content": "List /tmp"}]
TOOL_TURN = {
    "reasoning": "Need a listing.",
    "text": "On it.",
    "tool_calls": [{"name": "bash", "arguments": {"command": "ls /tmp"}}],
}


@pytest.mark.parametrize("stream", [False, True])
def test_sglang_calls_are_recorded_with_exact_ids_and_logprobs(
    make_stack: Any, tokenizer: Any, stream: bool
) -> None:
    stack = make_stack({"turns": [TOOL_TURN]}, wire="sglang")
    sid, key = stack.new_session()
    client = stack.openai(key)
    if stream:
        calls: dict[int, str] = {}
        finish = None
        for chunk in client.chat.completions.create(
            model="m", messages=USER, tools=[BASH_TOOL], stream=True
        ):
            for choice in chunk.choices:
                for call in choice.delta.tool_calls or ():
                    calls[call.index] = calls.get(call.index, "") + (call.function.arguments or "")
                finish = choice.finish_reason or finish
        arguments = calls[0]
    else:
        reply = client.chat.completions.create(model="m", messages=USER, tools=[BASH_TOOL])
        finish = reply.choices[0].finish_reason
        arguments = reply.choices[0].message.tool_calls[0].function.arguments  # type: ignore[index]
    assert finish == "tool_calls"
    assert json.loads(arguments) == {"command": "ls /tmp"}
    (record,) = stack.records(sid)
    assert record.status is RecordStatus.COMPLETED
    assert record.engine == "sglang"
    assert record.finish_reason is FinishReason.TOOL_CALLS
    (sent,) = stack.engine.requests
    assert sent["stream"] is False, "SGLang refuses capture flags on streaming requests"
    assert sent["return_prompt_token_ids"] and sent["return_meta_info"] and sent["logprobs"]
    rendered = httpx.post(
        f"{stack.engine.url}/tokenize", json={"messages": sent["messages"], "tools": sent["tools"]}
    ).json()
    assert list(record.prompt_ids) == rendered["tokens"]
    assert list(record.output_logprobs) == [
        logprob_for(i, t) for i, t in enumerate(record.output_ids)
    ]
    assert tokenizer.decode(list(record.output_ids)).endswith("</tool_call><|im_end|>")


def test_sglang_fake_refuses_capture_flags_when_streaming(tokenizer: Any) -> None:
    with ScriptedEngine(Script.from_dict({"turns": []}), tokenizer, wire="sglang") as engine:
        reply = httpx.post(
            f"{engine.url}/v1/chat/completions",
            json={
                "model": "x",
                "messages": USER,
                "stream": True,
                "return_meta_info": True,
            },
        )
    assert reply.status_code == 400
    assert reply.json() == {
        "object": "error",
        "message": "return_meta_info is not supported with streaming. "
        "Please set stream=false when using return_meta_info=true.",
        "type": "BadRequest",
        "param": None,
        "code": 400,
    }


def test_sglang_error_body_reaches_the_client(make_stack: Any) -> None:
    stack = make_stack({"turns": [{"text": "x", "expect": {"messages": 5}}]}, wire="sglang")
    sid, key = stack.new_session()
    with stack.client(key) as client:
        reply = client.post("/v1/chat/completions", json={"model": "m", "messages": USER})
    assert reply.status_code == 502
    assert "expected 5 messages" in reply.json()["error"]["message"]
    assert stack.records(sid)[0].status is RecordStatus.FAILED
