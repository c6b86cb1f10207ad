"""The max-tokens policy (:mod:`polar.proxy.maxtokens`): pure functions, hand-computed cases."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from polar.ir import ChatRequest, EditKind, Message, Role, Sampling, TextPart
from polar.proxy.errors import EngineUnavailable
from polar.proxy.maxtokens import (
    ContextWindow,
    OutputLimit,
    PromptTooLong,
    context_from_models,
    limited,
    output_limit,
)


@pytest.mark.parametrize(
    ("requested", "prompt", "context", "default", "expected"),
    [
        # No limit asked: the rest of the context, 32768 - 18800 = 13968.
        (None, 18800, 32768, None, OutputLimit(None, 13968, EditKind.DEFAULTED_MAX_TOKENS)),
        # ... or the configured default when it is smaller.
        (None, 1000, 32768, 4096, OutputLimit(None, 4096, EditKind.DEFAULTED_MAX_TOKENS)),
        # ... but never more than the rest: 32768 - 30000 = 2768 < 4096.
        (None, 30000, 32768, 4096, OutputLimit(None, 2768, EditKind.DEFAULTED_MAX_TOKENS)),
        # Claude Code's 64000 on an 18,800-token prompt: clamped to 13968.
        (64000, 18800, 32768, None, OutputLimit(64000, 13968, EditKind.CLAMPED_MAX_TOKENS)),
        # One over the rest is clamped; exactly the rest is kept.
        (13969, 18800, 32768, None, OutputLimit(13969, 13968, EditKind.CLAMPED_MAX_TOKENS)),
        (13968, 18800, 32768, None, OutputLimit(13968, 13968)),
        # A client's own limit within the context is the client's business.
        (8000, 18800, 32768, 4096, OutputLimit(8000, 8000)),
        # A prompt leaving one token: one token.
        (None, 32767, 32768, None, OutputLimit(None, 1, EditKind.DEFAULTED_MAX_TOKENS)),
        # Context unknown: only the default can apply.
        (None, 500, None, 4096, OutputLimit(None, 4096, EditKind.DEFAULTED_MAX_TOKENS)),
        (None, 500, None, None, OutputLimit(None, None)),
        (64000, 500, None, 4096, OutputLimit(64000, 64000)),
    ],
)
def test_the_limit_follows_the_policy(
    requested: int | None, prompt: int, context: int | None, default: int | None, expected: Any
) -> None:
    got = output_limit(requested, prompt_tokens=prompt, context=context, default=default)
    assert got == expected


@pytest.mark.parametrize("prompt", [32768, 40000])
def test_a_prompt_that_fills_the_context_is_the_clients_error(prompt: int) -> None:
    with pytest.raises(PromptTooLong, match=f"maximum context length is 32768.*takes {prompt}"):
        output_limit(None, prompt_tokens=prompt, context=32768)
    assert PromptTooLong("x").status == 400


def request(max_tokens: int | None) -> ChatRequest:
    return ChatRequest(
        model="policy",
        messages=(Message(role=Role.USER, parts=(TextPart("hi"),)),),
        sampling=Sampling(max_tokens=max_tokens, temperature=0.5),
    )


def test_a_changed_limit_is_an_edit_and_the_rest_of_the_request_is_kept() -> None:
    clamped, edits = limited(request(128000), prompt_tokens=2768, context=32768)
    assert clamped.sampling.max_tokens == 30000
    assert clamped.sampling.temperature == 0.5 and clamped.messages == request(1).messages
    (edit,) = edits
    assert edit.kind is EditKind.CLAMPED_MAX_TOKENS
    assert edit.detail == (
        "max_tokens 128000 asked; max_tokens 30000 applied "
        "(context 32768 - prompt 2768 = 30000 left)"
    )
    defaulted, (edit,) = limited(request(None), prompt_tokens=68, context=100)
    assert defaulted.sampling.max_tokens == 32 and edit.kind is EditKind.DEFAULTED_MAX_TOKENS
    assert edit.detail.startswith("no limit asked; max_tokens 32 applied")
    kept = request(16)
    assert limited(kept, prompt_tokens=68, context=100) == (kept, ())


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ({"data": [{"id": "tiny", "max_model_len": 32768}]}, 32768),
        ({"data": [{"id": "other", "max_model_len": 1}, {"id": "tiny", "max_model_len": 8}]}, 8),
        ({"data": [{"id": "served-as-something-else", "max_model_len": 4096}]}, 4096),
        ({"data": [{"id": "a", "max_model_len": 1}, {"id": "b", "max_model_len": 2}]}, None),
        ({"data": [{"id": "tiny"}]}, None),
        ({"data": [{"id": "tiny", "max_model_len": "32768"}]}, None),
        ({"data": [{"id": "tiny", "max_model_len": True}]}, None),
        ({"data": [{"id": "tiny", "max_model_len": 0}]}, None),
        ({"data": "nope"}, None),
        ([], None),
    ],
)
def test_the_context_length_is_read_from_v1_models(reply: object, expected: int | None) -> None:
    assert context_from_models(reply, "tiny") == expected


def test_the_engine_is_asked_once_and_again_only_after_a_failure() -> None:
    answers: list[int | Exception | None] = [EngineUnavailable("down"), 4096]
    asked = 0

    async def fetch() -> int | None:
        nonlocal asked
        asked += 1
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def main() -> list[int | None]:
        window = ContextWindow(fetch=fetch)
        return [await window.length() for _ in range(3)]

    assert asyncio.run(main()) == [None, 4096, 4096]
    assert asked == 2
    configured = ContextWindow(1024, fetch)
    assert asyncio.run(configured.length()) == 1024 and asked == 2
