"""Verdicts and statistics: one outcome per attempt, filters in a fixed order,
judged by attempt index so the arrival order of results changes nothing, and
tallies that always add up."""

from __future__ import annotations

import random
from typing import Any

import pytest

from polar.rollout.protocol import SessionResult, SessionStatus
from polar.sft.accept import Acceptance
from polar.sft.stats import GenerationStats, stats_table
from polar.sft.verdict import (
    AttemptKey,
    AttemptSummary,
    FilterReason,
    Filters,
    Outcome,
    TraceSummary,
    judge,
    sampled_digest,
    summarize,
)
from polar.trajectory import ChainClass
from polar.trajectory.export import SampleRow

RULE = Acceptance.parse("reward >= 1")


def trace(name: str, *, cls: ChainClass = ChainClass.MAIN, tokens: int = 100) -> TraceSummary:
    return TraceSummary(f"s/{name}", cls, tokens, f"digest-{name}")


def attempt(
    status: SessionStatus = SessionStatus.COMPLETED,
    reward: float | None = 1.0,
    traces: tuple[TraceSummary, ...] = (),
    error: str | None = None,
) -> AttemptSummary:
    return AttemptSummary(status, reward, None, error, traces or (trace("solution"),), "s")


def outcomes(attempts: list[AttemptSummary], filters: Filters | None = None) -> list[Any]:
    keyed = [(AttemptKey("t", i), a) for i, a in enumerate(attempts)]
    return [(v.outcome, v.reason) for v in judge(keyed, RULE, filters or Filters())]


def test_each_session_status_has_its_outcome() -> None:
    got = outcomes(
        [
            attempt(reward=1.0),
            attempt(reward=0.0),
            attempt(SessionStatus.TIMEOUT, reward=None, error="ran past"),
            attempt(SessionStatus.ERROR, reward=None, error="exited with 1"),
            attempt(SessionStatus.CANCELLED, reward=None),
            attempt(SessionStatus.COMPLETED, reward=None),
        ]
    )
    assert got == [
        (Outcome.ACCEPTED, None),
        (Outcome.TESTS_FAILED, None),
        (Outcome.TIMEOUT, None),
        (Outcome.ERROR, None),
        (Outcome.ERROR, None),
        (Outcome.ERROR, None),
    ]


def test_side_calls_are_dropped_and_an_attempt_left_with_nothing_is_filtered() -> None:
    side = trace("title", cls=ChainClass.SIDE_CALL)
    keyed = [
        (AttemptKey("t", 0), attempt(traces=(side, trace("main")))),
        (AttemptKey("t", 1), attempt(traces=(side,))),
    ]
    first, second = judge(keyed, RULE, Filters())
    assert first.outcome is Outcome.ACCEPTED and first.kept == ("s/main",)
    assert (second.outcome, second.reason) == (Outcome.FILTERED, FilterReason.NO_TRACES)
    kept = judge(keyed, RULE, Filters(keep_side_calls=True))
    assert kept[0].kept == ("s/title", "s/main")
    assert kept[1].outcome is Outcome.ACCEPTED


def test_traces_past_the_length_limit_are_dropped() -> None:
    short, long = trace("short", tokens=50), trace("long", tokens=500)
    keyed = [
        (AttemptKey("t", 0), attempt(traces=(short, long))),
        (AttemptKey("t", 1), attempt(traces=(trace("long2", tokens=501),))),
    ]
    first, second = judge(keyed, RULE, Filters(max_tokens=500))
    assert first.kept == ("s/short", "s/long")
    first, second = judge(keyed, RULE, Filters(max_tokens=499))
    assert first.kept == ("s/short",)
    assert (second.outcome, second.reason) == (Outcome.FILTERED, FilterReason.TOO_LONG)


def test_a_repeated_solution_is_a_duplicate_only_of_an_accepted_one() -> None:
    same = (trace("a"), trace("b"))
    got = outcomes(
        [
            attempt(reward=0.0, traces=same),  # failed: not a solution anyone keeps
            attempt(traces=same),
            attempt(traces=same),
            attempt(traces=(trace("a"),)),  # a different solution
        ]
    )
    assert got == [
        (Outcome.TESTS_FAILED, None),
        (Outcome.ACCEPTED, None),
        (Outcome.FILTERED, FilterReason.DUPLICATE),
        (Outcome.ACCEPTED, None),
    ]
    assert (
        outcomes([attempt(traces=same)] * 2, Filters(dedupe=False))
        == [(Outcome.ACCEPTED, None)] * 2
    )


def test_the_per_task_cap_keeps_the_first_attempts_by_index() -> None:
    attempts = [attempt(traces=(trace(str(i)),)) for i in range(4)]
    keyed = [(AttemptKey("t", i), a) for i, a in enumerate(attempts)]
    random.Random(3).shuffle(keyed)  # arrival order does not matter
    verdicts = judge(keyed, RULE, Filters(per_task_cap=2))
    assert [(v.key.attempt, v.outcome, v.reason) for v in verdicts] == [
        (0, Outcome.ACCEPTED, None),
        (1, Outcome.ACCEPTED, None),
        (2, Outcome.FILTERED, FilterReason.TASK_CAP),
        (3, Outcome.FILTERED, FilterReason.TASK_CAP),
    ]


def test_a_summary_keeps_what_the_verdict_needs_and_reads_back_equal() -> None:
    row = SampleRow(
        trace_id="ses/0.0",
        session_id="ses",
        group_id=None,
        builder="prefix_merge",
        chain=0,
        segment=0,
        chain_class="main",
        break_reason=None,
        trainable=True,
        policy_version=0,
        prompt_ids=[1, 2, 3],
        response_ids=[4, 5, 6, 7],
        loss_mask=[1, 0, 1, 1],
        rollout_logprobs=[-0.5, 0.0, -0.5, -0.5],
        logprob_mask=[1, 0, 1, 1],
        reward=1.0,
        reward_scale=1.0,
        finish_reason="stop",
        source_records=["ses/1.1"],
        turn_offsets=[],
        truncated_turns=0,
        malformed_tool_calls=0,
    )
    result = SessionResult(
        session_id="ses",
        task_id="t",
        sample_index=0,
        status=SessionStatus.COMPLETED,
        reward=1.0,
        resolved=True,
        samples=[row],
    )
    summary = summarize(result)
    assert summary.traces == (TraceSummary("ses/0.0", ChainClass.MAIN, 7, sampled_digest(row)),)
    assert AttemptSummary.from_json(summary.to_json()) == summary
    # Only sampled tokens make the digest: interstitial tokens do not.
    other = {**row, "response_ids": [4, 99, 6, 7]}
    assert sampled_digest(other) == sampled_digest(row)
    assert sampled_digest({**row, "response_ids": [4, 5, 6, 8]}) != sampled_digest(row)


@pytest.mark.parametrize("seed", range(40))
def test_random_runs_tally_up_and_do_not_depend_on_arrival_order(seed: int) -> None:
    rng = random.Random(seed)
    statuses = [SessionStatus.COMPLETED] * 4 + [SessionStatus.TIMEOUT, SessionStatus.ERROR]
    planned = {f"task{i}": rng.randint(1, 8) for i in range(rng.randint(1, 4))}
    keyed = []
    for task, n in planned.items():
        for index in range(rng.randint(0, n)):
            traces = tuple(
                trace(
                    f"{rng.randint(0, 2)}",
                    cls=rng.choice([ChainClass.MAIN, ChainClass.SIDE_CALL]),
                    tokens=rng.randint(10, 200),
                )
                for _ in range(rng.randint(0, 2))
            )
            status = rng.choice(statuses)
            reward = rng.choice([0.0, 1.0]) if status is SessionStatus.COMPLETED else None
            keyed.append(
                (AttemptKey(task, index), AttemptSummary(status, reward, None, None, traces, "s"))
            )
    filters = Filters(
        dedupe=rng.random() < 0.5,
        max_tokens=rng.choice([None, 100]),
        per_task_cap=rng.choice([None, 1, 2]),
    )

    def verdicts(order: list[Any]) -> list[Any]:
        return [
            v
            for task in planned
            for v in judge([k for k in order if k[0].task == task], RULE, filters)
        ]

    first = verdicts(keyed)
    shuffled = list(keyed)
    rng.shuffle(shuffled)
    assert verdicts(shuffled) == first, f"seed {seed}"
    assert sorted(v.key for v in first) == sorted(k for k, _ in keyed), f"seed {seed}"
    stats = GenerationStats.of("reward >= 1", filters, planned, first)
    table = stats.to_json()
    for tally in [table["overall"], *table["tasks"]]:
        assert tally["attempts"] == tally["accepted"] + sum(tally["rejected"].values()), seed
        assert tally["rejected"]["filtered"] == sum(tally["filtered"].values()), seed
        assert tally["attempts"] <= tally["planned"], seed
    assert table["overall"]["attempts"] == len(keyed), f"seed {seed}"
    assert table["complete"] is (len(keyed) == sum(planned.values())), f"seed {seed}"


def test_the_statistics_json_and_table_show_every_reason() -> None:
    keyed = [
        (AttemptKey("a", 0), attempt()),
        (AttemptKey("a", 1), attempt()),
        (AttemptKey("a", 2), attempt(reward=0.0)),
        (AttemptKey("b", 0), attempt(SessionStatus.TIMEOUT, reward=None)),
    ]
    verdicts = judge(keyed[:3], RULE, Filters()) + judge(keyed[3:], RULE, Filters())
    stats = GenerationStats.of("reward >= 1", Filters(), {"a": 3, "b": 2}, verdicts)
    assert stats.to_json() == {
        "version": 1,
        "complete": False,
        "accept": "reward >= 1",
        "filters": {
            "dedupe": True,
            "keep_side_calls": False,
            "max_tokens": None,
            "per_task_cap": None,
        },
        "overall": {
            "planned": 5,
            "attempts": 4,
            "accepted": 1,
            "rate": 0.25,
            "rejected": {"tests_failed": 1, "timeout": 1, "error": 0, "filtered": 1},
            "filtered": {"no_traces": 0, "too_long": 0, "duplicate": 1, "task_cap": 0},
        },
        "tasks": [
            {
                "task": "a",
                "planned": 3,
                "attempts": 3,
                "accepted": 1,
                "rate": 1 / 3,
                "rejected": {"tests_failed": 1, "timeout": 0, "error": 0, "filtered": 1},
                "filtered": {"no_traces": 0, "too_long": 0, "duplicate": 1, "task_cap": 0},
            },
            {
                "task": "b",
                "planned": 2,
                "attempts": 1,
                "accepted": 0,
                "rate": 0.0,
                "rejected": {"tests_failed": 0, "timeout": 1, "error": 0, "filtered": 0},
                "filtered": {"no_traces": 0, "too_long": 0, "duplicate": 0, "task_cap": 0},
            },
        ],
    }
    from rich.console import Console

    console = Console(width=120, record=True)
    console.print(stats_table(stats))
    text = console.export_text()
    assert (
        "│ a       │      3/3 │        1 │ 33.3% │            1 │       0 │     0 │ "
        "1 (duplicate 1) │" in text
    )
    assert "overall" in text and "4/5" in text


def test_a_rollout_task_that_ended_without_a_session_is_an_error_attempt() -> None:
    from polar.rollout.protocol import TaskResult, TaskStatus
    from polar.sft.generate import last_result

    task = TaskResult(
        task_id="sft.fix-median.a0",
        task="fix-median",
        group_id="g",
        status=TaskStatus.CANCELLED,
        results=[],
        usable=0,
    )
    (verdict,) = judge(
        [(AttemptKey("fix-median", 0), summarize(last_result(task)))], RULE, Filters()
    )
    assert verdict.outcome is Outcome.ERROR
    assert verdict.detail == "the rollout task ended cancelled without a session result"
