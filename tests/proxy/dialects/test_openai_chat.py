"""OpenAI Chat Completions through the gateway, against the scripted vLLM look-alike.

Everything here is real: the OpenAI Python client, the gateway under uvicorn,
the scripted engine as an HTTP server speaking vLLM's wire format, and the
real Qwen3 tokenizer. Only the model is scripted.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from polar.ir import FinishReason, RecordStatus
from polar.testing.scripted.vllm_wire import logprob_for

from support.stack import BASH_TOOL

TOOL_TURN = {
    "reasoning": "The user wants a listing.",
    "text": "Listing now.",
    "tool_calls": [{"name": "bash", "arguments": {"command": "ls -la /tmp"}}],
}
USER = [{"role": "user", "content": "What is in /tmp?"}]


def expected_output_text(reasoning: str, content: str, calls: list[tuple[str, str]]) -> str:
    """What the sampled ids must decode to, rebuilt from what the client received."""
    tool_text = "\n".join(
        f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'
        for name, arguments in calls
    )
    return f"{reasoning}</think>{content}{tool_text}<|im_end|>"


def collect_stream(chunks: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "content": "",
        "reasoning": "",
        "calls": {},
        "finish": None,
        "usage": None,
    }
    for chunk in chunks:
        if chunk.usage is not None:
            out["usage"] = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta
            out["content"] += delta.content or ""
            out["reasoning"] += (delta.model_extra or {}).get("reasoning_content") or ""
            for call in delta.tool_calls or ():
                slot = out["calls"].setdefault(call.index, {"id": None, "name": "", "args": ""})
                slot["id"] = call.id or slot["id"]
                if call.function is not None:
                    slot["name"] += call.function.name or ""
                    slot["args"] += call.function.arguments or ""
            if choice.finish_reason:
                out["finish"] = choice.finish_reason
    return out


def test_non_streaming_text_reply_and_record(make_stack: Any, tokenizer: Any) -> None:
    stack = make_stack({"turns": [{"text": "Hello there."}]})
    sid, key = stack.new_session()
    reply = stack.openai(key).chat.completions.create(model="my-model", messages=USER)
    assert reply.model == "my-model"
    assert reply.object == "chat.completion"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].message.content == "\n\nHello there."
    (record,) = stack.records(sid)
    assert record.status is RecordStatus.COMPLETED
    assert record.finish_reason is FinishReason.STOP
    assert record.seq == 1 and record.attempt == 1
    assert record.engine_request["model"] == "scripted"
    assert record.engine_request["return_token_ids"] is True
    assert tokenizer.decode(list(record.output_ids)) == expected_output_text(
        "\n", reply.choices[0].message.content or "", []
    )
    assert reply.usage is not None
    assert reply.usage.completion_tokens == len(record.output_ids)
    assert reply.usage.prompt_tokens == len(record.prompt_ids)
    stack.engine.assert_clean()


def test_streaming_text_arrives_in_pieces_with_usage_and_done(make_stack: Any) -> None:
    # The engine sends each token on its own (steps sent together are passed on
    # together: tests/proxy/test_engine_faults.py).
    stack = make_stack({"turns": [{"text": "One two three four five."}]}, token_delay_s=0.02)
    sid, key = stack.new_session()
    with (
        stack.client(key) as client,
        client.stream(
            "POST",
            "/v1/chat/completions",
            json={
                "model": "m",
                "messages": USER,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        ) as response,
    ):
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    texts = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    assert sum(1 for t in texts if t) > 3, "text should arrive token by token"
    assert "".join(t or "" for t in texts) == "\n\nOne two three four five."
    finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finish[0]["choices"][0]["finish_reason"] == "stop"
    usage = chunks[-1]
    assert usage["choices"] == []
    (record,) = stack.records(sid)
    assert usage["usage"]["completion_tokens"] == len(record.output_ids)
    assert usage["usage"]["prompt_tokens"] == len(record.prompt_ids)
    assert all(c.get("usage") is None for c in chunks[:-1])


def test_usage_chunk_only_when_asked(make_stack: Any) -> None:
    stack = make_stack({"turns": [{"text": "hi"}]})
    _, key = stack.new_session()
    chunks = list(stack.openai(key).chat.completions.create(model="m", messages=USER, stream=True))
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize("stream", [True, False])
def test_tool_call_reaches_client_and_ids_decode_to_what_it_received(
    make_stack: Any, tokenizer: Any, stream: bool
) -> None:
    stack = make_stack({"turns": [TOOL_TURN]})
    sid, key = stack.new_session()
    client = stack.openai(key)
    if stream:
        got = collect_stream(
            client.chat.completions.create(model="m", messages=USER, tools=[BASH_TOOL], stream=True)
        )
        content, reasoning, finish = got["content"], got["reasoning"], got["finish"]
        calls = [(c["name"], c["args"], c["id"]) for _, c in sorted(got["calls"].items())]
    else:
        reply = client.chat.completions.create(model="m", messages=USER, tools=[BASH_TOOL])
        message = reply.choices[0].message
        content = message.content or ""
        reasoning = (message.model_extra or {}).get("reasoning_content") or ""
        finish = reply.choices[0].finish_reason
        calls = [(c.function.name, c.function.arguments, c.id) for c in message.tool_calls or ()]
    assert finish == "tool_calls"
    assert [(name, json.loads(args)) for name, args, _ in calls] == [
        ("bash", {"command": "ls -la /tmp"})
    ]
    assert reasoning == "The user wants a listing.\n"
    (record,) = stack.records(sid)
    assert record.finish_reason is FinishReason.TOOL_CALLS
    assert record.message is not None
    assert [c.id for c in record.message.tool_calls] == [calls[0][2]]
    decoded = tokenizer.decode(list(record.output_ids))
    assert decoded == expected_output_text(reasoning, content, [(n, a) for n, a, _ in calls])
    # One logprob per sampled token, each the one the engine reported for it.
    assert len(record.output_logprobs) == len(record.output_ids)
    assert list(record.output_logprobs) == [
        logprob_for(i, t) for i, t in enumerate(record.output_ids)
    ]
    stack.engine.assert_clean()


def test_streamed_tool_call_arguments_arrive_incrementally(make_stack: Any) -> None:
    stack = make_stack({"turns": [TOOL_TURN]}, token_delay_s=0.01)  # each token on its own
    _, key = stack.new_session()
    pieces = []
    for chunk in stack.openai(key).chat.completions.create(
        model="m", messages=USER, tools=[BASH_TOOL], stream=True
    ):
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or ():
                if call.function and call.function.arguments:
                    pieces.append(call.function.arguments)
    assert len(pieces) > 2
    assert json.loads("".join(pieces)) == {"command": "ls -la /tmp"}


def test_multi_turn_tool_loop_records_every_call_in_order(make_stack: Any) -> None:
    stack = make_stack(
        {
            "turns": [
                TOOL_TURN,
                {"text": "It holds one file.", "expect": {"last_role": "tool"}},
            ]
        }
    )
    sid, key = stack.new_session()
    client = stack.openai(key)
    first = client.chat.completions.create(model="m", messages=USER, tools=[BASH_TOOL])
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    history = [
        *USER,
        {
            "role": "assistant",
            "content": first.choices[0].message.content,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"command":"ls -la /tmp"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": [{"type": "text", "text": "a.txt"}]},
    ]
    second = client.chat.completions.create(model="m", messages=history, tools=[BASH_TOOL])
    assert second.choices[0].message.content == "\n\nIt holds one file."
    records = stack.records(sid)
    assert [r.seq for r in records] == [1, 2]
    assert len(records[1].prompt_ids) > len(records[0].prompt_ids)
    stack.engine.assert_clean()


def test_reasoning_streams_as_reasoning_content(make_stack: Any) -> None:
    stack = make_stack({"turns": [{"reasoning": "Think step by step here.", "text": "42"}]})
    _, key = stack.new_session()
    got = collect_stream(
        stack.openai(key).chat.completions.create(model="m", messages=USER, stream=True)
    )
    assert got["reasoning"] == "Think step by step here.\n"
    assert got["content"] == "\n\n42"


def test_reasoning_field_is_configurable(make_stack: Any) -> None:
    stack = make_stack(
        {"turns": [{"reasoning": "hidden", "text": "shown"}]},
        dialects={"openai_chat": {"reasoning_field": "none"}},
    )
    _, key = stack.new_session()
    with stack.client(key) as client:
        body = client.post("/v1/chat/completions", json={"model": "m", "messages": USER}).json()
    message = body["choices"][0]["message"]
    assert "reasoning_content" not in message and "reasoning" not in message
    assert message["content"] == "\n\nshown"


def test_training_fields_never_reach_the_client(make_stack: Any) -> None:
    stack = make_stack({"turns": [{"text": "plain"}, {"text": "streamed"}]})
    _, key = stack.new_session()
    with stack.client(key) as client:
        body = client.post("/v1/chat/completions", json={"model": "m", "messages": USER}).text
        streamed = client.post(
            "/v1/chat/completions", json={"model": "m", "messages": USER, "stream": True}
        ).text
    for text in (body, streamed):
        for leaked in ("token_ids", "prompt_token_ids", "prompt_text", "stop_reason"):
            assert leaked not in text
        assert '"logprobs":null' in text.replace(" ", "")
        assert 'logprob":' not in text.replace(" ", "")


@pytest.mark.parametrize("stream", [True, False])
def test_logprobs_returned_when_the_client_asks(
    make_stack: Any, tokenizer: Any, stream: bool
) -> None:
    stack = make_stack({"turns": [{"text": "abc def"}]})
    sid, key = stack.new_session()
    client = stack.openai(key)
    if stream:
        entries = []
        for chunk in client.chat.completions.create(
            model="m", messages=USER, logprobs=True, top_logprobs=2, stream=True
        ):
            for choice in chunk.choices:
                if choice.logprobs and choice.logprobs.content:
                    entries.extend(choice.logprobs.content)
    else:
        reply = client.chat.completions.create(
            model="m", messages=USER, logprobs=True, top_logprobs=2
        )
        assert reply.choices[0].logprobs is not None
        entries = list(reply.choices[0].logprobs.content or ())
    (record,) = stack.records(sid)
    assert [e.logprob for e in entries] == list(record.output_logprobs)
    assert [e.token for e in entries] == [tokenizer.decode([t]) for t in record.output_ids]
    assert all(len(e.top_logprobs) == 2 for e in entries)


def test_unknown_request_fields_are_tolerated_and_logged_once(
    make_stack: Any, caplog: pytest.LogCaptureFixture
) -> None:
    stack = make_stack({"turns": [{"text": "a"}, {"text": "b"}]})
    _, key = stack.new_session()
    caplog.set_level(logging.WARNING, logger="polar.proxy.gateway")
    with stack.client(key) as client:
        for _ in range(2):
            reply = client.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": USER, "frobnicate": 3, "user": "u"},
            )
            assert reply.status_code == 200
    warnings = [r.getMessage() for r in caplog.records if "frobnicate" in r.getMessage()]
    assert len(warnings) == 1
    assert not any("'user'" in r.getMessage() for r in caplog.records)


def test_content_parts_and_developer_role_reach_the_engine(make_stack: Any) -> None:
    stack = make_stack({"turns": [{"text": "ok"}]})
    _, key = stack.new_session()
    stack.openai(key).chat.completions.create(
        model="m",
        messages=[
            {"role": "developer", "content": "Be terse."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
        ],
        max_completion_tokens=50,
        temperature=0.5,
        stop=None,
    )
    (sent,) = stack.engine.requests
    assert sent["messages"][0] == {"role": "system", "content": "Be terse."}
    assert sent["messages"][1]["content"] == [
        {"type": "text", "text": "a"},
        {"type": "text", "text": "b"},
    ]
    assert sent["max_tokens"] == 50
    assert sent["temperature"] == 0.5
