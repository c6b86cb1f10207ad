"""Steps read together are handed on as one delta: nothing lost, reordered or held back."""

from __future__ import annotations

import random

from polar.ir import Delta, TokenLogprob, ToolCallDelta
from polar.proxy.engines.replies import Steps

Step = tuple[
    tuple[int, ...],
    tuple[float, ...],
    tuple[TokenLogprob, ...] | None,
    str,
    str,
    tuple[ToolCallDelta, ...],
]


def _step(rng: random.Random, details: bool) -> Step:
    ids = tuple(rng.randrange(0, 150_000) for _ in range(rng.randrange(0, 4)))
    logprobs = tuple(-rng.random() for _ in ids)
    detail = (
        tuple(TokenLogprob(str(i), lp) for i, lp in zip(ids, logprobs, strict=True))
        if details
        else None
    )
    calls = tuple(
        ToolCallDelta(index=rng.randrange(3), arguments=rng.choice(["", "{", '"a"']))
        for _ in range(rng.randrange(0, 2))
    )
    return ids, logprobs, detail, rng.choice(["", "a", "é", " b"]), rng.choice(["", "r"]), calls


def _concat(steps: list[Step]) -> tuple[object, ...]:
    """All the steps' fields concatenated, field by field."""
    return (
        [i for s in steps for i in s[0]],
        [x for s in steps for x in s[1]],
        [x for s in steps for x in s[2] or ()],
        "".join(s[3] for s in steps),
        "".join(s[4] for s in steps),
        [c for s in steps for c in s[5]],
    )


def test_takes_add_up_to_the_steps_in_order_with_detail_parallel_to_ids() -> None:
    for seed in range(300):
        rng = random.Random(seed)
        details = rng.random() < 0.5
        steps = Steps(details)
        added: list[Step] = []
        taken: list[Delta] = []
        for _ in range(rng.randrange(0, 20)):
            step = _step(rng, details)
            steps.add(*step)
            added.append(step)
            if rng.random() < 0.3:
                out = steps.take()
                assert len(out) == 1 and isinstance(out[0], Delta), f"seed {seed}"
                taken.append(out[0])
                assert steps.take() == [], f"seed {seed}: a second take finds nothing"
        taken += [d for d in steps.take() if isinstance(d, Delta)]

        as_steps: list[Step] = [
            (d.token_ids, d.logprobs, d.details, d.text, d.reasoning, d.tool_calls) for d in taken
        ]
        assert _concat(as_steps) == _concat(added), f"seed {seed}"
        for d in taken:
            assert (d.details is not None) == details, f"seed {seed}"
            if d.details is not None:
                assert len(d.details) == len(d.token_ids), f"seed {seed}"


def test_nothing_added_takes_nothing() -> None:
    assert Steps(details=True).take() == []
