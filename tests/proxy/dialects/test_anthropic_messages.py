"""Anthropic Messages through the gateway: the official SDK as the client, the
scripted engine behind, both capture modes; every streamed event validated
against the SDK's types and Anthropic's event order."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest

from polar.ir import EditKind, FinishReason, PromptOrigin
from polar.testing.scripted.vllm_wire import logprob_for

from support.grammar import check_anthropic_stream, sse_events

BASH = {
    "name": "Bash",
    "description": "Run a command.",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}
BILLING = "x-anthropic-billing-header: cc_version=2.1.197.c40; cc_entrypoint=sdk-cli;"
SYSTEM = [
    {"type": "text", "text": BILLING},
    {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
]
USER = {
    "role": "user",
    "content": [
        {"type": "text", "text": "<system-reminder>\nToday is Sunday.\n</system-reminder>\n"},
        {"type": "text", "text": "Create proof.txt", "cache_control": {"type": "ephemeral"}},
    ],
}
TOOL_TURN = {
    "reasoning": "I will write the file.",
    "text": "Writing it.",
    "tool_calls": [{"name": "Bash", "arguments": {"command": "echo polar > proof.txt"}}],
}
CAPTURES = ["engine_rendered", "token_in_token_out"]


def post(stack: Any, key: str, body: dict[str, Any], path: str = "/v1/messages") -> httpx.Response:
    return httpx.post(
        f"{stack.url}{path}",
        headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
        json=body,
        timeout=30,
    )


@pytest.mark.parametrize("capture", CAPTURES)
def test_streamed_tool_use_follows_the_event_grammar(
    make_stack: Any, tokenizer: Any, capture: str
) -> None:
    stack = make_stack({"turns": [TOOL_TURN]}, capture=capture)
    sid, key = stack.new_session()
    body = {
        "model": "claude-opus-4-8",
        "max_tokens": 4000,
        "system": SYSTEM,
        "messages": [USER],
        "tools": [BASH],
        "thinking": {"type": "adaptive"},
        "stream": True,
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    }
    reply = post(stack, key, {**body}, "/v1/messages?beta=true")
    assert reply.status_code == 200
    message = check_anthropic_stream(sse_events(reply.text))
    assert message["stop_reason"] == "tool_use"
    thinking, text, tool = message["content"]
    assert thinking["type"] == "thinking" and thinking["thinking"] == "I will write the file.\n"
    assert text == {"type": "text", "text": "\n\nWriting it.\n"}
    assert tool["name"] == "Bash" and tool["input"] == {"command": "echo polar > proof.txt"}
    (record,) = stack.records(sid)
    assert record.finish_reason is FinishReason.TOOL_CALLS
    assert [e.kind for e in record.edits] == [EditKind.STRIPPED_BILLING_HEADER]
    assert record.edits[0].detail == BILLING
    assert BILLING not in tokenizer.decode(list(record.prompt_ids))
    assert "You are Claude Code." in tokenizer.decode(list(record.prompt_ids))
    assert message["usage"]["output_tokens"] == len(record.output_ids)
    assert list(record.output_logprobs) == [
        logprob_for(i, t) for i, t in enumerate(record.output_ids)
    ]
    # What the client received is exactly what the model sampled.
    call = json.dumps(tool["input"])
    expected = (
        f"{thinking['thinking']}</think>{text['text']}"
        f'<tool_call>\n{{"name": "Bash", "arguments": {call}}}\n</tool_call><|im_end|>'
    )
    assert tokenizer.decode(list(record.output_ids)) == expected


@pytest.mark.parametrize("capture", CAPTURES)
def test_tool_loop_with_the_sdk_and_append_only_tokens(make_stack: Any, capture: str) -> None:
    after_tool = (
        {"prompt_contains": "<tool_response>"}
        if capture == "token_in_token_out"
        else {"last_role": "tool"}
    )
    stack = make_stack(
        {"turns": [TOOL_TURN, {"text": "Done.", "expect": after_tool}]}, capture=capture
    )
    sid, key = stack.new_session()
    client = stack.anthropic(key)
    with client.messages.stream(
        model="m", max_tokens=4000, system=SYSTEM, messages=[USER], tools=[BASH],  # type: ignore[arg-type]
        thinking={"type": "enabled", "budget_tokens": 1024},
    ) as stream:  # fmt: skip
        first = stream.get_final_message()
    tool_use = next(b for b in first.content if b.type == "tool_use")
    history = [
        USER,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": tool_use.id,
                    "content": "",
                    "is_error": False,
                },
            ],
        },
    ]
    second = client.messages.create(
        model="m",
        max_tokens=4000,
        system=SYSTEM,
        messages=history,
        tools=[BASH],  # type: ignore[arg-type]
    )
    assert second.stop_reason == "end_turn"
    assert [b.type for b in second.content] == ["text"]
    _, second_record = stack.records(sid)
    lineage = second_record.lineage
    assert lineage is not None
    if capture == "token_in_token_out":
        assert lineage.origin is PromptOrigin.EXTENDS and lineage.spliced
    else:  # the engine renders history itself; the lineage says whether it still extends
        assert lineage.origin in (PromptOrigin.EXTENDS, PromptOrigin.REWRITTEN)
        assert lineage.base_seq == 1


def test_non_streamed_reply_is_a_valid_message(make_stack: Any) -> None:
    stack = make_stack({"turns": [TOOL_TURN]})
    _, key = stack.new_session()
    body = {
        "model": "m",
        "max_tokens": 100,
        "system": "Be brief.",
        "messages": [USER],
        "tools": [BASH],
    }
    reply = post(stack, key, body)
    message = anthropic.types.Message.model_validate(reply.json())
    assert message.stop_reason == "tool_use"
    assert [b.type for b in message.content] == ["text", "tool_use"], "no thinking unless asked"


def test_stop_reasons_map_to_anthropics(make_stack: Any) -> None:
    stack = make_stack(
        {"turns": [{"text": "one two three four five", "finish": "length", "max_tokens": 4}]}
    )
    _, key = stack.new_session()
    reply = post(stack, key, {"model": "m", "max_tokens": 4, "messages": [USER]})
    assert reply.json()["stop_reason"] == "max_tokens"


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (
            lambda b: b["messages"][0]["content"].append({"type": "document", "source": {}}),
            "'document'",
        ),
        (lambda b: b["messages"][0]["content"].append({"type": "hologram"}), "'hologram'"),
        (
            lambda b: b["tools"].append({"type": "web_search_20250305", "name": "web_search"}),
            "server tool",
        ),
        (lambda b: b.pop("max_tokens"), "max_tokens: field required"),
        (lambda b: b["messages"][0].update(role="robot"), "role"),
        (
            lambda b: b["messages"][0]["content"].append(
                {"type": "tool_use", "id": "x", "name": "y"}
            ),
            "'tool_use'",
        ),
    ],
)
def test_bad_requests_get_anthropic_errors(make_stack: Any, mutate: Any, needle: str) -> None:
    stack = make_stack({"turns": []})
    sid, key = stack.new_session()
    body = {
        "model": "m",
        "max_tokens": 10,
        "messages": [json.loads(json.dumps(USER))],
        "tools": [BASH],
    }
    mutate(body)
    reply = post(stack, key, body)
    assert reply.status_code == 400
    error = reply.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert needle in error["error"]["message"]
    assert stack.engine.requests == [] and stack.records(sid) == []


def test_unknown_key_gets_an_anthropic_401(make_stack: Any) -> None:
    stack = make_stack({"turns": []})
    reply = post(stack, "sk-ant-nope", {"model": "m", "max_tokens": 5, "messages": [USER]})
    assert reply.status_code == 401
    assert reply.json() == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "unknown or closed session key"},
    }


@pytest.mark.parametrize("capture", CAPTURES)
def test_count_tokens_counts_what_would_be_rendered(make_stack: Any, capture: str) -> None:
    stack = make_stack({"turns": [{"text": "ok"}]}, capture=capture)
    sid, key = stack.new_session()
    body = {"model": "m", "system": SYSTEM, "messages": [USER], "tools": [BASH]}
    counted = post(stack, key, body, "/v1/messages/count_tokens").json()["input_tokens"]
    post(stack, key, {**body, "max_tokens": 10})
    (record,) = stack.records(sid)
    assert counted == len(record.prompt_ids)


def test_the_base_url_answers_a_probe(make_stack: Any) -> None:
    stack = make_stack({"turns": []})
    assert httpx.head(f"{stack.url}/").status_code == 200
