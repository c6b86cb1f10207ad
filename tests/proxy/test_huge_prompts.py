"""Prompts that cannot fit the context, refused before they are tokenized whole.

Token-in/token-out capture, the scripted engine (its context: 32,768 tokens).
A prompt of megabytes used to be tokenized whole (seconds) before the gateway
said it did not fit, and the refusal named its exact length. Now it is refused
on the bytes-per-token bound, or once the tokens counted so far pass the
context, and the refusal says how many it takes *at least*. A prompt that fits
still gets its exact ids. How long a refusal takes is measured by
``benchmarks/reliability.py big-prompts`` (timing claims live there).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from polar.ir import Dialect, RecordStatus
from polar.proxy.render.tokenbound import PIECE_CHARS

from support.faulty import PATHS, assert_dialect_error, client_headers, request_body

CONTEXT = 32768
WORDS_2MB = " ".join(["word"] * ((2 << 20) // 5))
"""About 420,000 tokens in 2 MB: more than the bytes-per-token bound can tell
(2 MB / 128 bytes = 16,384), so they are counted, and only until they pass the context."""
MESSAGES_15MB = [
    {"role": "user", "content": "x " * ((4 << 20) // 2 - 16)} for _ in range(4)
]  # fmt: skip
"""Four strings of almost 4 MiB (the longest a request may carry): refused on the bound."""


def _body(dialect: Dialect, messages: list[dict[str, Any]]) -> dict[str, Any]:
    field = "input" if dialect is Dialect.OPENAI_RESPONSES else "messages"
    return {**request_body(dialect, stream=False), field: messages}


@pytest.mark.parametrize("dialect", list(PATHS))
def test_a_prompt_that_cannot_fit_is_refused_as_soon_as_that_is_known(
    make_stack: Any, dialect: Dialect
) -> None:
    stack = make_stack({"turns": [{"text": "ok"}], "cycle": True}, capture="token_in_token_out")
    sid, key = stack.new_session()
    refusals = [
        (MESSAGES_15MB, lambda n: n > 100_000),  # the bound alone: 15 MB / 128 bytes
        ([{"role": "user", "content": WORDS_2MB}], lambda n: CONTEXT <= n < 200_000),
    ]
    with httpx.Client(base_url=stack.url, headers=client_headers(key), timeout=120) as client:
        for messages, plausible in refusals:
            reply = client.post(PATHS[dialect], json=_body(dialect, messages))
            message = assert_dialect_error(dialect, reply, 400)
            assert f"maximum context length is {CONTEXT} tokens" in message, message
            at_least = int(message.split("at least ")[1].split(":")[0])
            assert plausible(at_least), message
    assert stack.records(sid) == [], "nothing reached the engine"
    assert stack.engine.requests == []


def test_a_huge_turn_appended_to_a_spliced_conversation_is_refused_too(make_stack: Any) -> None:
    """The second call extends the first (its prompt is spliced): only the new
    text is counted, and only until the whole passes the context."""
    stack = make_stack({"turns": [{"text": "ok"}], "cycle": True}, capture="token_in_token_out")
    sid, key = stack.new_session()
    first = [{"role": "user", "content": "hi"}]
    with httpx.Client(base_url=stack.url, headers=client_headers(key), timeout=120) as client:
        path = PATHS[Dialect.OPENAI_CHAT]
        reply = client.post(path, json=_body(Dialect.OPENAI_CHAT, first))
        assert reply.status_code == 200, reply.text
        answer = reply.json()["choices"][0]["message"]
        grown = [*first, {"role": "assistant", "content": answer["content"]}]
        grown.append({"role": "user", "content": WORDS_2MB})
        message = assert_dialect_error(
            Dialect.OPENAI_CHAT, client.post(path, json=_body(Dialect.OPENAI_CHAT, grown)), 400
        )
    assert "takes at least" in message, message
    assert [r.status for r in stack.records(sid)] == [RecordStatus.COMPLETED]


def test_a_long_prompt_that_fits_gets_its_exact_ids(make_stack: Any, chat_template: Any) -> None:
    """Counted in pieces (it is longer than one), encoded exactly as a whole."""
    stack = make_stack({"turns": [{"text": "ok"}], "cycle": True}, capture="token_in_token_out")
    sid, key = stack.new_session()
    text = "\n".join(f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(1400))
    messages = [{"role": "user", "content": text}]
    with httpx.Client(base_url=stack.url, headers=client_headers(key), timeout=120) as client:
        reply = client.post(PATHS[Dialect.OPENAI_CHAT], json=_body(Dialect.OPENAI_CHAT, messages))
    assert reply.status_code == 200, reply.text
    (record,) = stack.records(sid)
    rendered = chat_template.render_text(messages, None, kwargs={})
    assert len(rendered) > PIECE_CHARS
    assert list(record.prompt_ids) == chat_template.text.encode(rendered)
