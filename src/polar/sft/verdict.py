"""Which attempts become SFT data, and why the others do not (pure functions).

Every finished attempt gets exactly one :class:`Outcome`:

- ``accepted``: scored, passed the acceptance rule and every filter: exported;
- ``tests_failed``: scored, and the rule said no;
- ``timeout``: the harness ran past its budget (such a session is not scored);
- ``error``: it could not be run, built or scored, or was cancelled;
- ``filtered``: passed the rule, then dropped by a filter (:class:`FilterReason`).

Filters run per task over its attempts in index order, so verdicts depend on
the results, never on the order they arrived in:

1. the traces to keep: side-call chains go (unless ``keep_side_calls``), and
   so does any trace longer than ``max_tokens`` (prompt + response). None
   left: ``too_long`` if the length limit dropped one, else ``no_traces``
   (the agent never called the model, or only made side calls);
2. ``duplicate``: the same solution as an accepted attempt before it: the
   model sampled the same tokens in the same kept traces;
3. ``task_cap``: the task already has ``per_task_cap`` accepted attempts.

A result is reduced to an :class:`AttemptSummary` when it arrives (what the
verdict needs: status, reward, and per trace its class, length and a digest of
its sampled tokens), so verdicts for a whole run are computed without holding
its results in memory.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from polar.rollout.protocol import SessionResult, SessionStatus
from polar.sft.accept import Acceptance
from polar.trajectory import ChainClass


@dataclass(frozen=True, slots=True, order=True)
class AttemptKey:
    """One attempt: the ``attempt``-th (from 0) session of dataset task ``task``."""

    task: str
    attempt: int

    def __str__(self) -> str:
        return f"{self.task}/{self.attempt}"


class Outcome(StrEnum):
    ACCEPTED = "accepted"
    TESTS_FAILED = "tests_failed"
    TIMEOUT = "timeout"
    ERROR = "error"
    FILTERED = "filtered"


REJECTIONS = (Outcome.TESTS_FAILED, Outcome.TIMEOUT, Outcome.ERROR, Outcome.FILTERED)


class FilterReason(StrEnum):
    NO_TRACES = "no_traces"
    TOO_LONG = "too_long"
    DUPLICATE = "duplicate"
    TASK_CAP = "task_cap"


@dataclass(frozen=True, slots=True)
class Filters:
    dedupe: bool = True
    keep_side_calls: bool = False
    max_tokens: int | None = None
    """Drop traces longer than this (prompt + response tokens)."""
    per_task_cap: int | None = None
    """Accept at most this many attempts per task (the first ones, by index)."""


@dataclass(frozen=True, slots=True)
class TraceSummary:
    trace_id: str
    chain_class: ChainClass
    tokens: int
    """Prompt + response tokens."""
    digest: str
    """SHA-256 of the sampled tokens (response tokens with loss mask 1)."""


@dataclass(frozen=True, slots=True)
class AttemptSummary:
    """What a verdict needs of a :class:`~polar.rollout.protocol.SessionResult`."""

    status: SessionStatus
    reward: float | None
    resolved: bool | None
    error: str | None
    traces: tuple[TraceSummary, ...]
    session_id: str

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "status": self.status.value,
                "reward": self.reward,
                "resolved": self.resolved,
                "error": self.error,
                "session_id": self.session_id,
                "traces": [
                    [t.trace_id, t.chain_class.value, t.tokens, t.digest] for t in self.traces
                ],
            }
        )

    @classmethod
    def from_json(cls, raw: bytes) -> AttemptSummary:
        data = orjson.loads(raw)
        return cls(
            status=SessionStatus(data["status"]),
            reward=data["reward"],
            resolved=data["resolved"],
            error=data["error"],
            session_id=data["session_id"],
            traces=tuple(
                TraceSummary(trace_id, ChainClass(cls_), tokens, digest)
                for trace_id, cls_, tokens, digest in data["traces"]
            ),
        )


def sampled_digest(row: Mapping[str, Any]) -> str:
    """SHA-256 of a sample row's sampled tokens (as little-endian uint32)."""
    sampled = array(
        "I", (t for t, m in zip(row["response_ids"], row["loss_mask"], strict=True) if m)
    )
    return hashlib.sha256(sampled.tobytes()).hexdigest()


def summarize(result: SessionResult) -> AttemptSummary:
    return AttemptSummary(
        status=result.status,
        reward=result.reward,
        resolved=result.resolved,
        error=result.error,
        session_id=result.session_id,
        traces=tuple(
            TraceSummary(
                trace_id=row["trace_id"],
                chain_class=ChainClass(row["chain_class"]),
                tokens=len(row["prompt_ids"]) + len(row["response_ids"]),
                digest=sampled_digest(row),
            )
            for row in result.samples
        ),
    )


@dataclass(frozen=True, slots=True)
class Verdict:
    key: AttemptKey
    outcome: Outcome
    reason: FilterReason | None = None
    """Why it was filtered (``outcome`` is ``filtered``)."""
    kept: tuple[str, ...] = ()
    """Accepted: the ids of the traces to export."""
    detail: str | None = None
    """Errors and timeouts: the session's error."""


def kept_traces(summary: AttemptSummary, filters: Filters) -> tuple[list[TraceSummary], bool]:
    """The traces to export, and whether the length limit dropped any."""
    kept, too_long = [], False
    for trace in summary.traces:
        if trace.chain_class is ChainClass.SIDE_CALL and not filters.keep_side_calls:
            continue
        if filters.max_tokens is not None and trace.tokens > filters.max_tokens:
            too_long = True
            continue
        kept.append(trace)
    return kept, too_long


def judge(
    attempts: Sequence[tuple[AttemptKey, AttemptSummary]],
    acceptance: Acceptance,
    filters: Filters,
) -> list[Verdict]:
    """Verdicts for one task's finished attempts (given in any order; judged by index)."""
    verdicts = []
    accepted = 0
    solutions: set[tuple[str, ...]] = set()
    for key, s in sorted(attempts):
        match s.status:
            case SessionStatus.TIMEOUT:
                verdicts.append(Verdict(key, Outcome.TIMEOUT, detail=s.error))
                continue
            case SessionStatus.ERROR | SessionStatus.CANCELLED:
                verdicts.append(Verdict(key, Outcome.ERROR, detail=s.error or s.status.value))
                continue
            case SessionStatus.COMPLETED if s.reward is None:
                verdicts.append(Verdict(key, Outcome.ERROR, detail="completed without a reward"))
                continue
            case SessionStatus.COMPLETED:
                pass
            case _:
                verdicts.append(Verdict(key, Outcome.ERROR, detail=f"ended {s.status.value}"))
                continue
        assert s.reward is not None
        if not acceptance(s.reward, s.resolved):
            verdicts.append(Verdict(key, Outcome.TESTS_FAILED))
            continue
        kept, too_long = kept_traces(s, filters)
        solution = tuple(t.digest for t in kept)
        reason = None
        if not kept:
            reason = FilterReason.TOO_LONG if too_long else FilterReason.NO_TRACES
        elif filters.dedupe and solution in solutions:
            reason = FilterReason.DUPLICATE
        elif filters.per_task_cap is not None and accepted >= filters.per_task_cap:
            reason = FilterReason.TASK_CAP
        if reason is not None:
            verdicts.append(Verdict(key, Outcome.FILTERED, reason=reason))
            continue
        accepted += 1
        solutions.add(solution)
        verdicts.append(Verdict(key, Outcome.ACCEPTED, kept=tuple(t.trace_id for t in kept)))
    return verdicts
