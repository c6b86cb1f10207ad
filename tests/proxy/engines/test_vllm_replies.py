"""Reading vLLM's chat replies, checked on real vLLM output (tests/fixtures/vllm)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polar.ir import Delta, Finish, FinishReason, PromptTokens
from polar.proxy.call.relay import Accumulator
from polar.proxy.engines.openai_compat import logprob_details
from polar.proxy.engines.transport import SSEDecoder
from polar.proxy.engines.vllm import StreamReader, parse_reply
from polar.proxy.engines.vllm_tokens import _choice_delta
from polar.proxy.errors import EngineProtocolError

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"


def _events(raw: bytes, cuts: list[int]) -> list[Any]:
    decoder = SSEDecoder()
    out = []
    start = 0
    for cut in [*sorted(cuts), len(raw)]:
        out.extend(decoder.feed(raw[start:cut]))
        start = cut
    out.extend(decoder.close())
    return out


def test_real_streamed_tool_call_is_read_exactly() -> None:
    raw = (FIXTURES / "tool_stream.sse").read_bytes()
    reader = StreamReader()
    events: list[Any] = []
    for sse in _events(raw, []):
        events.extend(reader.feed(sse.data))
        events.extend(reader.take())  # one step at a time, as if each came on its own
    events.append(reader.finish())
    prompt = [e for e in events if isinstance(e, PromptTokens)]
    deltas = [e for e in events if isinstance(e, Delta)]
    finish = events[-1]
    assert isinstance(finish, Finish) and finish.reason is FinishReason.TOOL_CALLS
    acc = Accumulator()
    for delta in deltas:
        acc.add(delta)
    chunks = [
        json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: {")
    ]
    sent_ids = [i for c in chunks for ch in c["choices"] for i in ch.get("token_ids", [])]
    sent_lps = [
        e["logprob"]
        for c in chunks
        for ch in c["choices"]
        for e in ((ch.get("logprobs") or {}).get("content") or [])
    ]
    assert acc.output_ids == sent_ids
    assert acc.logprobs == sent_lps
    assert len(prompt) == 1 and list(prompt[0].ids) == chunks[0]["prompt_token_ids"]
    assert finish.usage.completion_tokens == len(sent_ids)
    message = acc.message()
    assert [(c.name, json.loads(c.arguments)) for c in message.tool_calls] == [
        ("bash", {"command": "ls -la"})
    ]
    assert message.text == "\n\nSure.\n"


def test_real_non_streamed_tool_call_is_read_exactly() -> None:
    reply = json.loads((FIXTURES / "tool_nonstream.json").read_text())
    prompt, delta, finish = parse_reply(reply)
    assert isinstance(prompt, PromptTokens) and isinstance(delta, Delta)
    assert isinstance(finish, Finish)
    assert list(prompt.ids) == reply["prompt_token_ids"]
    assert list(delta.token_ids) == reply["choices"][0]["token_ids"]
    assert list(delta.logprobs) == [
        e["logprob"] for e in reply["choices"][0]["logprobs"]["content"]
    ]
    assert delta.tool_calls[0].name == "bash"
    assert finish.reason is FinishReason.TOOL_CALLS


def test_top_logprobs_details_survive() -> None:
    reply = json.loads((FIXTURES / "text_top2.json").read_text())
    _, delta, _ = parse_reply(reply)
    assert isinstance(delta, Delta) and delta.details is not None
    assert [len(d.top) for d in delta.details] == [2, 2, 2]
    assert delta.reasoning == reply["choices"][0]["message"]["reasoning"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=14384), max_size=6))
def test_sse_decoding_does_not_depend_on_how_bytes_are_split(cuts: list[int]) -> None:
    raw = (FIXTURES / "tool_stream.sse").read_bytes()
    whole = [(e.event, e.data) for e in _events(raw, [])]
    assert [(e.event, e.data) for e in _events(raw, cuts)] == whole
    assert whole[-1][1] == b"[DONE]"


def test_sse_decoder_handles_crlf_comments_and_event_names() -> None:
    raw = b': keep-alive\r\nevent: message_start\r\ndata: {"a":\r\ndata: 1}\r\n\r\ndata: x'
    events = _events(raw, [5, 17])
    assert [(e.event, e.data) for e in events] == [("message_start", b'{"a":\n1}'), (None, b"x")]


@pytest.mark.parametrize(
    "bad",
    [[256], [-1], [True], [1, False], ["a"], [1.0], [0, 300], [[1]]],
    ids=["too big", "negative", "bool", "bool among ints", "string", "float", "one of two", "list"],
)
def test_token_bytes_that_are_not_bytes_are_refused(bad: list[Any]) -> None:
    entry = {"token": "x", "logprob": -0.5, "bytes": bad, "top_logprobs": []}
    with pytest.raises(EngineProtocolError, match="not bytes"):
        logprob_details([entry])
    ok = logprob_details([{**entry, "bytes": [0, 120, 255]}, {**entry, "bytes": []}])
    assert [d.bytes for d in ok] == [(0, 120, 255), ()]


@pytest.mark.parametrize(
    ("logprobs", "what"),
    [
        ({"token_logprobs": [-0.5, True], "tokens": ["a", "b"]}, "a logprob"),
        ({"token_logprobs": [-0.5, "x"], "tokens": ["a", "b"]}, "a logprob"),
        ({"token_logprobs": [-0.5, -1.0], "tokens": ["a", 7]}, "a logprobs token"),
        (
            {"token_logprobs": [-0.5, -1.0], "tokens": ["a", "b"], "top_logprobs": [{}, []]},
            "a top logprobs entry",
        ),
        (
            {"token_logprobs": [-0.5, -1.0], "tokens": ["a", "b"], "top_logprobs": [{"a": None}]},
            "a top logprob",
        ),
    ],
)
def test_a_token_engines_bad_logprobs_are_refused(logprobs: dict[str, Any], what: str) -> None:
    choice = {"token_ids": [5, 6], "logprobs": logprobs}
    with pytest.raises(EngineProtocolError, match=what):
        _choice_delta(choice, details=True)


def test_a_token_engines_logprobs_are_read_with_their_top_entries() -> None:
    choice = {
        "token_ids": [5, 6],
        "logprobs": {
            "token_logprobs": [-0.5, -1],
            "tokens": ["a", None],
            "top_logprobs": [{"a": -0.5, "b": -2}, None],
        },
    }
    delta = _choice_delta(choice, details=True)
    assert delta.logprobs == (-0.5, -1.0) and type(delta.logprobs[1]) is float
    assert delta.details is not None
    assert [(d.token, d.logprob, [(t.token, t.logprob) for t in d.top]) for d in delta.details] == [
        ("a", -0.5, [("a", -0.5), ("b", -2.0)]),
        ("", -1.0, []),
    ]
