"""The max-tokens policy (:mod:`polar.proxy.call.maxtokens`): pure functions, worked cases."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from polar.ir import ChatRequest, EditKind, Message, Role, Sampling, TextPart
from polar.proxy.call.maxtokens import (
    ContextSource,
    ContextWindow,
    OutputLimit,
    PromptTooLong,
    context_from_models,
    limited,
    output_limit,
)
from polar.proxy.errors import EngineHTTPError, EngineUnavailable


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


def test_the_engine_is_asked_at_start_and_in_the_background_until_it_answers() -> None:
    """A failed try (engine down, a 5xx) is repeated in the background; calls read
    what is known meanwhile and never wait; once answered, it is not asked again."""
    answers: list[int | Exception | None] = [
        EngineUnavailable("down"),
        EngineHTTPError("engine returned 503", upstream_status=503),
        4096,
    ]
    asked = 0

    async def fetch() -> int | None:
        nonlocal asked
        asked += 1
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def main() -> list[Any]:
        window = ContextWindow(fetch=fetch, retry_s=0.01)
        await window.start()
        seen: list[Any] = [window.length, window.source]
        for _ in range(1000):  # the background question, answered
            if window.length is not None:
                break
            await asyncio.sleep(0.01)
        seen += [window.length, window.source, window.health()]
        await window.aclose()
        return seen

    assert asyncio.run(main()) == [
        None,
        ContextSource.ASKING,
        4096,
        ContextSource.ENGINE,
        {"max_model_len": 4096, "source": "engine"},
    ]
    assert asked == 3
    configured = ContextWindow(1024, fetch)
    asyncio.run(configured.start())
    assert configured.length == 1024 and asked == 3


def test_a_stalled_engine_is_given_up_on_after_the_timeout_and_asked_again() -> None:
    stalls = [True, False]

    async def fetch() -> int | None:
        if stalls.pop(0):
            await asyncio.sleep(3600)
        return 2048

    async def main() -> tuple[Any, ...]:
        window = ContextWindow(fetch=fetch, ask_timeout_s=0.05, retry_s=0.01)
        await window.start()  # returns after the timeout, not after the stall
        first = (window.length, window.source)
        for _ in range(1000):  # the background question, answered
            if window.length is not None:
                break
            await asyncio.sleep(0.01)
        await window.aclose()
        return first, window.length

    assert asyncio.run(main()) == ((None, ContextSource.ASKING), 2048)


@pytest.mark.parametrize(
    "answer",
    [None, EngineHTTPError("engine returned 404", upstream_status=404)],
)
def test_an_engine_that_answers_without_a_length_settles_it_unknown(answer: object) -> None:
    async def fetch() -> int | None:
        if isinstance(answer, Exception):
            raise answer
        return None

    async def main() -> ContextWindow:
        window = ContextWindow(fetch=fetch)
        await window.start()
        return window

    window = asyncio.run(main())
    assert (window.length, window.source, window.asked) == (None, ContextSource.UNKNOWN, 1)
    assert "engine.max_model_len" in window.health()["warning"]
