"""Token-in/token-out capture end to end: gateway renders, splices, parses.

The engine is the scripted one (vLLM's completions wire or SGLang's
``/generate``), so its sampled tokens are known; everything else is real.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from polar.ir import FinishReason, PromptOrigin, RecordStatus
from polar.testing.scripted.vllm_wire import logprob_for

from support.stack import BASH_TOOL

SYSTEM = {"role": "system", "content": "You are a coding agent."}
USER = {"role": "user", "content": "Count the files in /tmp."}
TOOL_TURN = {
    "reasoning": "I will list them.",
    "text": "Listing.",
    "tool_calls": [{"name": "bash", "arguments": {"command": "ls /tmp | wc -l"}}],
}
FINAL_TURN = {"reasoning": "Read the count.", "text": "There are 3 files."}


def _stream(client: Any, messages: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"content": "", "reasoning": "", "calls": {}, "finish": None}
    for chunk in client.chat.completions.create(
        model="m", messages=messages, tools=[BASH_TOOL], stream=True
    ):
        for choice in chunk.choices:
            out["content"] += choice.delta.content or ""
            out["reasoning"] += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            for call in choice.delta.tool_calls or ():
                slot = out["calls"].setdefault(call.index, {"id": "", "name": "", "args": ""})
                slot["id"] = call.id or slot["id"]
                slot["name"] += call.function.name or ""
                slot["args"] += call.function.arguments or ""
            out["finish"] = choice.finish_reason or out["finish"]
    return out


@pytest.mark.parametrize("wire", ["vllm", "sglang"])
@pytest.mark.parametrize("stream", [True, False])
def test_a_tool_loop_gives_append_only_prompts(
    make_stack: Any, tokenizer: Any, wire: str, stream: bool
) -> None:
    stack = make_stack(
        {"turns": [TOOL_TURN, {**FINAL_TURN, "expect": {"prompt_contains": "<tool_response>"}}]},
        wire=wire,
        capture="token_in_token_out",
    )
    sid, key = stack.new_session()
    client = stack.openai(key)
    messages = [SYSTEM, USER]
    if stream:
        first = _stream(client, messages)
        content, finish = first["content"], first["finish"]
        call = first["calls"][0]
        call_id, name, args = call["id"], call["name"], call["args"]
    else:
        reply = client.chat.completions.create(model="m", messages=messages, tools=[BASH_TOOL])
        content, finish = reply.choices[0].message.content or "", reply.choices[0].finish_reason
        tool_call = reply.choices[0].message.tool_calls[0]  # type: ignore[index]
        call_id, name, args = tool_call.id, tool_call.function.name, tool_call.function.arguments
    assert finish == "tool_calls"
    assert (name, json.loads(args)) == ("bash", {"command": "ls /tmp | wc -l"})
    # The harness re-serializes the arguments, trims the text and drops the reasoning.
    messages += [
        {
            "role": "assistant",
            "content": content.strip(),
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {
                        "name": name,
                        "arguments": json.dumps(json.loads(args), separators=(",", ":")),
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": [{"type": "text", "text": "3"}]},
    ]
    second = client.chat.completions.create(model="m", messages=messages, tools=[BASH_TOOL])
    assert second.choices[0].message.content == "\n\nThere are 3 files."
    first_record, second_record = stack.records(sid)
    assert first_record.lineage is not None and first_record.lineage.origin is PromptOrigin.FRESH
    lineage = second_record.lineage
    assert lineage is not None
    assert (lineage.origin, lineage.spliced, lineage.base_seq) == (PromptOrigin.EXTENDS, True, 1)
    head = first_record.prompt_ids + first_record.output_ids
    assert second_record.prompt_ids[: len(head)] == head
    assert lineage.shared_tokens == lineage.base_tokens == len(head)
    new = tokenizer.decode(list(second_record.prompt_ids[len(head) :]))
    assert new == (
        "\n<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )
    for record in (first_record, second_record):
        assert record.capture.value == "token_in_token_out"
        assert list(record.output_logprobs) == [
            logprob_for(i, t) for i, t in enumerate(record.output_ids)
        ]
    assert first_record.finish_reason is FinishReason.TOOL_CALLS
    assert first_record.engine_request.get(
        "prompt", first_record.engine_request.get("input_ids")
    ) == list(first_record.prompt_ids)
    stack.engine.assert_clean()


def test_edited_history_is_recorded_as_drift(make_stack: Any, tokenizer: Any) -> None:
    stack = make_stack(
        {"turns": [{"text": "First answer."}, {"text": "Second answer."}]},
        capture="token_in_token_out",
    )
    sid, key = stack.new_session()
    client = stack.openai(key)
    client.chat.completions.create(model="m", messages=[SYSTEM, USER])
    edited = [SYSTEM, {"role": "user", "content": "Count the files in /var."}]
    client.chat.completions.create(
        model="m", messages=[*edited, {"role": "assistant", "content": "First answer."}, USER]
    )
    first, second = stack.records(sid)
    lineage = second.lineage
    assert lineage is not None and lineage.origin is PromptOrigin.DIVERGED
    assert not lineage.spliced and lineage.base_seq == 1
    position = lineage.shared_tokens
    assert second.prompt_ids[:position] == first.prompt_ids[:position]
    assert second.prompt_ids[position] != first.prompt_ids[position]
    # The first differing token is where the user's text was edited.
    assert tokenizer.decode([first.prompt_ids[position]]) == "tmp"
    assert tokenizer.decode([second.prompt_ids[position]]) == "var"


def test_a_malformed_tool_call_reaches_the_client_as_text_and_is_flagged(make_stack: Any) -> None:
    broken = '{"name": "bash", "arguments": {"command": }'
    raw = f"</think>\n\n<tool_call>\n{broken}\n</tool_call><|im_end|>"
    stack = make_stack({"turns": [{"raw": raw}]}, capture="token_in_token_out")
    sid, key = stack.new_session()
    reply = stack.openai(key).chat.completions.create(
        model="m", messages=[SYSTEM, USER], tools=[BASH_TOOL]
    )
    message = reply.choices[0].message
    assert not message.tool_calls
    assert '<tool_call>\n{"name": "bash", "arguments": {"command": }\n</tool_call>' in (
        message.content or ""
    )
    assert reply.choices[0].finish_reason == "stop"
    (record,) = stack.records(sid)
    (bad,) = record.malformed_tool_calls
    assert "not valid JSON" in bad.reason


@pytest.mark.parametrize("wire", ["vllm", "sglang"])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("top", [0, 2])
def test_client_logprobs_in_token_mode_name_the_exact_tokens(
    make_stack: Any, tokenizer: Any, wire: str, stream: bool, top: int
) -> None:
    """Every sampled token reaches a client that asked for logprobs, with the
    tokenizer's own bytes, whichever engine sampled it (SGLang's /generate
    names no token text unless asked, and once gave the client none at all),
    and with the engine's alternatives when the client asked for some."""
    stack = make_stack(
        {"turns": [{"text": "héllo wörld"}]}, wire=wire, capture="token_in_token_out"
    )
    sid, key = stack.new_session()
    client = stack.openai(key)
    asked: Any = {"model": "m", "messages": [SYSTEM, USER], "logprobs": True, "top_logprobs": top}
    entries: list[Any] = []
    if stream:
        for chunk in client.chat.completions.create(**asked, stream=True):
            for choice in chunk.choices:
                entries += (choice.logprobs.content or []) if choice.logprobs else []
    else:
        reply = client.chat.completions.create(**asked)
        entries = reply.choices[0].logprobs.content or []  # type: ignore[union-attr]
    (record,) = stack.records(sid)
    assert [e.logprob for e in entries] == list(record.output_logprobs)
    assert (
        b"".join(bytes(e.bytes or []) for e in entries)
        == tokenizer.decode(list(record.output_ids)).encode()
    )
    for entry, token_id in zip(entries, record.output_ids, strict=True):
        assert entry.token == tokenizer.decode([token_id])
        assert len(entry.top_logprobs) == top
        if top:  # the scripted engines put the sampled token first
            assert entry.top_logprobs[0].token == entry.token
            assert entry.top_logprobs[0].logprob == entry.logprob
            assert entry.top_logprobs[1].logprob == entry.logprob - 1.5


def test_truncated_turn_then_continue_stays_append_only(make_stack: Any) -> None:
    stack = make_stack(
        {
            "turns": [
                {"text": "one two three four five six seven", "finish": "length", "max_tokens": 8},
                {"text": "ok"},
            ]
        },
        capture="token_in_token_out",
    )
    sid, key = stack.new_session()
    client = stack.openai(key)
    first = client.chat.completions.create(model="m", messages=[SYSTEM, USER])
    assert first.choices[0].finish_reason == "length"
    partial = first.choices[0].message.content or ""
    client.chat.completions.create(
        model="m",
        messages=[
            SYSTEM,
            USER,
            {"role": "assistant", "content": partial},
            {"role": "user", "content": "go on"},
        ],
    )
    a, b = stack.records(sid)
    assert a.finish_reason is FinishReason.LENGTH
    assert b.lineage is not None and b.lineage.origin is PromptOrigin.EXTENDS
    assert b.prompt_ids[: len(a.prompt_ids) + len(a.output_ids)] == a.prompt_ids + a.output_ids
    assert b.status is RecordStatus.COMPLETED


def test_a_closed_sessions_transcript_is_dropped(make_stack: Any) -> None:
    """What splicing keeps for a session (its calls' packed ids) goes when the
    session closes; the records stay."""
    stack = make_stack({"turns": [FINAL_TURN]}, capture="token_in_token_out")
    sid, key = stack.new_session()
    stack.openai(key).chat.completions.create(model="m", messages=[SYSTEM, USER])
    transcripts = stack.gateway.transcripts
    (record,) = stack.records(sid)
    held = transcripts.get(sid)
    assert len(held.calls) == 1 and held.calls[0].full.ids() == (
        record.prompt_ids + record.output_ids
    )
    assert (
        transcripts.bytes == held.charged == 4 * (len(record.prompt_ids) + len(record.output_ids))
    )
    with stack.admin() as admin:
        assert admin.delete(f"/admin/sessions/{sid}").status_code == 204
    assert len(transcripts) == 0 and transcripts.bytes == 0
    assert [r.key for r in stack.records(sid)] == [record.key]
