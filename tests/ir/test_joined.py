"""Deltas that arrived together are passed on as one: nothing is lost, reordered or held back."""

from __future__ import annotations

import itertools
import random

from polar.ir import (
    Delta,
    EngineEvent,
    Finish,
    FinishReason,
    PromptTokens,
    TokenLogprob,
    ToolCallDelta,
    Usage,
    joined,
)


def _delta(rng: random.Random, with_details: bool) -> Delta:
    n = rng.randrange(0, 4)
    ids = tuple(rng.randrange(0, 150_000) for _ in range(n))
    logprobs = tuple(-rng.random() for _ in ids)
    calls = tuple(
        ToolCallDelta(index=rng.randrange(3), arguments=rng.choice(["", "{", '"a"']))
        for _ in range(rng.randrange(0, 2))
    )
    return Delta(
        token_ids=ids,
        logprobs=logprobs,
        text=rng.choice(["", "a", "é", " b"]),
        reasoning=rng.choice(["", "r"]),
        tool_calls=calls,
        details=(
            tuple(
                TokenLogprob(token=str(i), logprob=lp) for i, lp in zip(ids, logprobs, strict=True)
            )
            if with_details
            else None
        ),
    )


def _events(rng: random.Random) -> list[EngineEvent]:
    events: list[EngineEvent] = []
    if rng.random() < 0.5:
        events.append(PromptTokens((1, 2, 3)))
    for _ in range(rng.randrange(0, 12)):
        roll = rng.random()
        if roll < 0.1:
            events.append(PromptTokens((rng.randrange(9),)))  # a retried attempt's prompt
        else:
            events.append(_delta(rng, with_details=roll < 0.4))
    if rng.random() < 0.7:
        events.append(Finish(reason=FinishReason.STOP, usage=Usage(3, 4)))
    return events


def _concat(deltas: list[Delta]) -> tuple[object, ...]:
    return (
        [i for d in deltas for i in d.token_ids],
        [x for d in deltas for x in d.logprobs],
        "".join(d.text for d in deltas),
        "".join(d.reasoning for d in deltas),
        [c for d in deltas for c in d.tool_calls],
        [x for d in deltas for x in d.details or ()],
    )


def test_joining_keeps_every_field_in_order_and_only_merges_neighbours() -> None:
    for seed in range(300):
        _check(seed)


def _check(seed: int) -> None:
    rng = random.Random(seed)
    events = _events(rng)
    out = joined(events)
    others = [e for e in events if not isinstance(e, Delta)]
    assert [e for e in out if not isinstance(e, Delta)] == others, f"seed {seed}"

    # Between two non-delta events, the deltas there add up to the same thing.
    def stretches(seq: list[EngineEvent]) -> list[tuple[object, ...]]:
        parts: list[list[Delta]] = [[]]
        for e in seq:
            if isinstance(e, Delta):
                parts[-1].append(e)
            else:
                parts.append([])
        return [_concat(p) for p in parts]

    assert stretches(out) == stretches(events), f"seed {seed}"
    for a, b in itertools.pairwise(out):
        if isinstance(a, Delta) and isinstance(b, Delta):
            # Only a change in whether per-token detail is there keeps neighbours apart.
            assert (a.details is None) != (b.details is None), f"seed {seed}"
    for d in out:
        if isinstance(d, Delta) and d.details is not None:
            assert len(d.details) == len(d.token_ids), f"seed {seed}"
    assert joined(out) == out, f"seed {seed}: joining twice changes nothing"


def test_a_single_event_comes_back_as_is() -> None:
    delta = Delta(token_ids=(5,), logprobs=(-0.1,), text="x")
    events: list[EngineEvent] = [delta]
    assert joined(events) is events
