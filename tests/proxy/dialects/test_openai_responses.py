"""OpenAI Responses through the gateway, the way Codex speaks it: the official SDK
as the client, the scripted engine behind, both capture modes; every streamed
event validated against the SDK's types and the documented event order."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import httpx
import pytest
from openai.types.responses import Response

from polar.ir import FinishReason, PromptOrigin
from polar.proxy.dialects.openai_responses.protocol import ENCRYPTED_REASONING, ResponsesRequest
from polar.proxy.dialects.openai_responses.translate import (
    decrypt_reasoning,
    reasoning_item,
    request_from_ir,
    request_to_ir,
)

from support.grammar import check_responses_stream, sse_events

EXEC = {
    "type": "function",
    "name": "exec_command",
    "description": "Runs a command in a PTY.",
    "strict": False,
    "parameters": {
        "type": "object",
        "properties": {"cmd": {"type": "string"}},
        "required": ["cmd"],
        "additionalProperties": False,
    },
}
AGENTS = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Sub-agents.",
    "tools": [
        {
            "type": "function",
            "name": "spawn_agent",
            "description": "Spawn a sub-agent.",
            "parameters": {"type": "object", "properties": {"task": {"type": "string"}}},
        }
    ],
}
PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Apply a patch.",
    "format": {"type": "text"},
}
INPUT = [
    {
        "type": "message",
        "id": "msg_dev",
        "role": "developer",
        "content": [{"type": "input_text", "text": "You are Codex."}],
    },
    {
        "type": "message",
        "id": "msg_user",
        "role": "user",
        "content": [{"type": "input_text", "text": "Create proof.txt"}],
    },
]
TOOL_TURN = {
    "reasoning": "Write the file.",
    "tool_calls": [{"name": "exec_command", "arguments": {"cmd": "echo polar > proof.txt"}}],
}
CAPTURES = ["engine_rendered", "token_in_token_out"]


def body(**fields: Any) -> dict[str, Any]:
    return {
        "model": "gpt-5-codex",
        "input": INPUT,
        "tools": [EXEC, AGENTS],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "019a-session",
        **fields,
    }


def post(stack: Any, key: str, payload: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{stack.url}/v1/responses",
        headers={"authorization": f"Bearer {key}"},
        json=payload,
        timeout=30,
    )


@pytest.mark.parametrize("capture", CAPTURES)
def test_streamed_function_call_follows_the_event_grammar(
    make_stack: Any, tokenizer: Any, capture: str
) -> None:
    stack = make_stack({"turns": [TOOL_TURN]}, capture=capture)
    sid, key = stack.new_session()
    reply = post(stack, key, body(stream=True))
    response = check_responses_stream(sse_events(reply.text))
    reasoning, call = response["output"]
    assert reasoning["type"] == "reasoning"
    assert decrypt_reasoning(reasoning["encrypted_content"]) == "Write the file.\n"
    assert call["type"] == "function_call" and call["name"] == "exec_command"
    assert json.loads(call["arguments"]) == {"cmd": "echo polar > proof.txt"}
    assert response["status"] == "completed"
    (record,) = stack.records(sid)
    assert record.finish_reason is FinishReason.TOOL_CALLS
    assert response["usage"]["output_tokens"] == len(record.output_ids)
    expected = (
        f"{reasoning['content'][0]['text']}</think>\n\n"
        '<tool_call>\n{"name": "exec_command", "arguments": '
        f"{call['arguments']}}}\n</tool_call><|im_end|>"
    )
    assert tokenizer.decode(list(record.output_ids)) == expected


@pytest.mark.parametrize("capture", CAPTURES)
def test_codex_style_loop_replays_reasoning_and_extends_prompts(
    make_stack: Any, capture: str
) -> None:
    after_tool = (
        {"prompt_contains": "<tool_response>"}
        if capture == "token_in_token_out"
        else {"last_role": "tool"}
    )
    stack = make_stack(
        {"turns": [TOOL_TURN, {"text": "Done.", "expect": after_tool}]}, capture=capture
    )
    sid, key = stack.new_session()
    client = stack.openai(key)
    events = list(client.responses.create(**body(stream=True)))
    first = events[-1].response  # type: ignore[union-attr]
    call = next(o for o in first.output if o.type == "function_call")
    replay = [o.model_dump(exclude_none=True) for o in first.output]
    replay += [{"type": "function_call_output", "call_id": call.call_id, "output": "ok\n"}]
    second = client.responses.create(**body(input=INPUT + replay))
    assert second.status == "completed" and second.output_text == "\n\nDone."
    records = stack.records(sid)
    lineage = records[1].lineage
    assert lineage is not None and lineage.base_seq == 1
    if capture == "token_in_token_out":
        assert lineage.origin is PromptOrigin.EXTENDS and lineage.spliced


def test_namespace_and_custom_tools_come_back_in_their_own_item_shapes(make_stack: Any) -> None:
    stack = make_stack(
        {
            "turns": [
                {"tool_calls": [{"name": "spawn_agent", "arguments": {"task": "read docs"}}]},
                {
                    "tool_calls": [
                        {"name": "apply_patch", "arguments": {"input": "*** Begin Patch"}}
                    ]
                },
            ]
        }
    )
    _, key = stack.new_session()
    spawn = Response.model_validate(post(stack, key, body(tools=[EXEC, AGENTS, PATCH])).json())
    (item,) = [o for o in spawn.output if o.type == "function_call"]
    assert item.namespace == "multi_agent_v1" and item.name == "spawn_agent"
    patch = post(stack, key, body(tools=[EXEC, AGENTS, PATCH], stream=True))
    response = check_responses_stream(sse_events(patch.text))
    (custom,) = [o for o in response["output"] if o["type"] == "custom_tool_call"]
    assert custom["name"] == "apply_patch" and custom["input"] == "*** Begin Patch"


def test_length_limit_is_an_incomplete_response(make_stack: Any) -> None:
    stack = make_stack({"turns": [{"text": "a b c d e f g", "finish": "length", "max_tokens": 5}]})
    _, key = stack.new_session()
    response = check_responses_stream(
        sse_events(post(stack, key, body(stream=True, max_output_tokens=5)).text)
    )
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}


@pytest.mark.parametrize(
    ("patch", "needle"),
    [
        ({"input": [{"type": "item_reference", "id": "x"}]}, "'item_reference'"),
        ({"tools": [{"type": "web_search"}]}, "'web_search'"),
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        (
            {"input": [{"type": "message", "role": "user", "content": [{"type": "input_audio"}]}]},
            "'input_audio'",
        ),
        ({"input": 5}, "input"),
        ({"tools": [EXEC, {**EXEC}]}, "more than once"),
    ],
)
def test_bad_requests_get_openai_errors(
    make_stack: Any, patch: dict[str, Any], needle: str
) -> None:
    stack = make_stack({"turns": []})
    sid, key = stack.new_session()
    reply = post(stack, key, body(**patch))
    assert reply.status_code == 400
    assert set(reply.json()["error"]) == {"message", "type", "param", "code"}
    assert needle in reply.json()["error"]["message"]
    assert stack.engine.requests == [] and stack.records(sid) == []


def test_engine_failure_mid_stream_is_response_failed(make_stack: Any) -> None:
    stack = make_stack({"turns": [{"text": " ".join(["word"] * 20), "crash_after": 6}]})
    _, key = stack.new_session()
    events = sse_events(post(stack, key, body(stream=True)).text)
    assert events[-1][1]["type"] == "response.failed"
    assert events[-1][1]["response"]["error"]["message"]


def test_encrypted_reasoning_is_a_typed_field_set_from_include() -> None:
    """The reply's ``encrypted_content`` follows ``ChatRequest.encrypted_reasoning``,
    which the translator sets from ``include``; ``include`` itself stays in
    ``extra`` only to rebuild the body, and nothing decides on it there."""
    asked = request_to_ir(ResponsesRequest.model_validate(body()))
    plain = request_to_ir(ResponsesRequest.model_validate(body(include=[])))
    assert asked.encrypted_reasoning and not plain.encrypted_reasoning
    assert request_from_ir(asked)["include"] == [ENCRYPTED_REASONING]
    item = reasoning_item("Think.\n", "rs_1", asked)
    assert decrypt_reasoning(item["encrypted_content"]) == "Think.\n"
    assert "encrypted_content" not in reasoning_item("Think.\n", "rs_1", plain)
    untyped = replace(asked, encrypted_reasoning=False)
    assert untyped.extra["include"] == [ENCRYPTED_REASONING]
    assert "encrypted_content" not in reasoning_item("Think.\n", "rs_1", untyped)
