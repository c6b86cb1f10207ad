"""Packed token ids: round trips, prefix lengths, and runs stored as deltas."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from polar.ir.tokenids import (
    MAX_DEPTH,
    TokenRun,
    best_shared_prefix,
    common_prefix,
    pack,
    pack_floats,
    unpack,
    unpack_floats,
)

ids = st.lists(st.integers(min_value=0, max_value=2**32 - 1), max_size=300)


@given(ids)
def test_ids_round_trip(values: list[int]) -> None:
    assert unpack(pack(values)) == tuple(values)


@given(st.lists(st.floats(allow_nan=False), max_size=100))
def test_logprobs_round_trip_exactly(values: list[float]) -> None:
    assert unpack_floats(pack_floats(values)) == tuple(values)


def test_an_id_outside_uint32_is_refused() -> None:
    with pytest.raises(OverflowError):
        pack([2**32])
    with pytest.raises(OverflowError):
        pack([-1])
    with pytest.raises(ValueError, match="multiple of 4 bytes"):
        unpack(b"abc")


@given(ids, ids, ids)
def test_common_prefix_matches_a_plain_scan(shared: list[int], a: list[int], b: list[int]) -> None:
    left, right = shared + a, shared + b
    expected = 0
    for x, y in zip(left, right, strict=False):
        if x != y:
            break
        expected += 1
    assert common_prefix(pack(left), pack(right)) == expected
    assert common_prefix(memoryview(pack(left)), pack(right)) == expected


@given(st.lists(st.tuples(st.integers(0, 400), ids), min_size=1, max_size=60))
def test_a_run_built_on_others_holds_exactly_its_ids(steps: list[tuple[int, list[int]]]) -> None:
    """Each step keeps a prefix of an earlier run (any length, even past what
    the two share) and adds its own ids; every run reads back exactly, however
    deep the chain (past MAX_DEPTH it is stored whole)."""
    runs: list[tuple[TokenRun, tuple[int, ...]]] = []
    for keep, more in steps:
        if runs:
            base, base_ids = runs[keep % len(runs)]
            expected = base_ids[: keep % (len(base_ids) + 1)] + tuple(more)
            run = TokenRun.of(pack(expected), on=base)
        else:
            expected = tuple(more)
            run = TokenRun.of(pack(expected))
        assert len(run) == len(expected)
        assert run.ids() == expected
        assert run.last() == (expected[-1] if expected else None)
        assert run.depth <= MAX_DEPTH
        runs.append((run, expected))
        sampled = tuple(range(keep % 7))
        longer = run.then(pack(sampled))
        assert longer.ids() == expected + sampled
        runs.append((longer, expected + sampled))


def test_a_run_that_continues_another_stores_only_what_is_new() -> None:
    first = TokenRun.of(pack(range(100_000)))
    second = TokenRun.of(pack([*range(100_000), 7, 8]), on=first)
    assert second.own_bytes() == 8
    assert second.ids()[-3:] == (99_999, 7, 8)


@pytest.mark.parametrize("seed", range(8))
def test_the_best_shared_prefix_is_the_newest_sharing_the_most(seed: int) -> None:
    """The search (newest first, skipping runs that cannot share more, stopping at
    a prompt shared whole) finds what comparing every run finds: the longest
    shared prefix, the newest run among those that tie; nothing when none shares
    a token. Runs built on others and prompts shorter than a run included."""
    rng = random.Random(seed)
    for case in range(60):
        stem = [rng.randint(0, 9) for _ in range(rng.randint(0, 12))]
        runs: list[tuple[int, TokenRun]] = []
        for label in range(rng.randint(0, 10)):
            ids = stem[: rng.randint(0, len(stem))] + [
                rng.randint(0, 3) for _ in range(rng.randint(0, 6))
            ]
            on = runs[-1][1] if runs and rng.random() < 0.5 else None
            runs.append((label, TokenRun.of(pack(ids), on=on)))
        prompt = pack(stem[: rng.randint(0, len(stem))] + [rng.randint(0, 3)] * rng.randint(0, 3))
        expected = None
        for label, run in runs:  # oldest first; a later tie wins
            shared = common_prefix(prompt, run.packed())
            if shared and (expected is None or shared >= expected[1]):
                expected = (label, shared)
        found = best_shared_prefix(prompt, runs, lambda entry: entry[1])
        got = None if found is None else (found[0][0], found[1])
        assert got == expected, f"seed {seed} case {case}"
