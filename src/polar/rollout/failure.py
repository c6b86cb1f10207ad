"""Whose failure a failed session is, and what every consumer does with it.

The agent is the model acting through its harness. A session that fails has
one :class:`FailureReason`, decided where the failure happens (the node's
pipeline, :mod:`polar.rollout.node.lifecycle`; the rollout server for a session
that never reached a node or whose node was lost) and carried on
:attr:`SessionResult.failure <polar.rollout.protocol.SessionResult.failure>`.
Each reason has one :class:`Fault`, and the fault alone decides the session's
:class:`SessionUse`, through :func:`session_use`: the one function the
reference trainer, its evaluation, the rollout server's resampling and every
bridge call.

=================  ======  ==============  ===============================================
reason             where   fault           when
=================  ======  ==============  ===============================================
``timeout``        node    agent           the harness ran past ``session_timeout_s``
``agent_exit``     node    agent           the harness exited non-zero after the model
                                           answered (its turn or context limit, output it
                                           could not use)
``sandbox_limit``  node    agent           the sandbox hit a limit while the agent ran
``harness``        node    infrastructure  the harness could not be installed or started,
                                           or it ended (exit, timeout, limit) before the
                                           model answered any call
``engine``         node    infrastructure  the session's last model call failed at the
                                           engine or gateway (however the harness ended)
``preparation``    node    infrastructure  workspace, task files, runtime, set-up, key
``build``          node    infrastructure  no trajectory could be built from the records
``evaluator``      node    infrastructure  the evaluator crashed or overran its budget, or
                                           a sandbox hit a limit while it scored
``internal``       node    infrastructure  an unexpected error on the node (a bug)
``node_lost``      server  infrastructure  the node stopped answering, died, or no longer
                                           holds the session
``refused``        server  infrastructure  the node refused the dispatch (its policy)
``unknown``        --      infrastructure  an ERROR result of an older node or server,
                                           which named no reason
``cancelled``      both    none            the task was cancelled, the group stopped
                                           early, or the server did not want the session
=================  ======  ==============  ===============================================

==============================  ==========  =====================  ======================
the session                     use         trainers               evaluation
==============================  ==========  =====================  ======================
completed, with a reward        ``scored``  trained, its reward    counted, its reward
failed, fault ``agent``         ``failed``  trained, reward 0.0    counted as 0, unsolved
                                            (its partial
                                            trajectory)
failed, fault infrastructure    ``masked``  not trained            not counted
or none
==============================  ==========  =====================  ======================

The rollout server replaces (``max_resamples``) only sessions the
infrastructure failed (:func:`replaceable`): the agent's failures are results,
and replacing them would keep only the attempts that did not fail; a cancelled
session is not wanted. A replaced session is in no group: consumers read
:attr:`TaskResult.current <polar.rollout.protocol.TaskResult.current>`.

Ambiguous cases, decided:

- **A harness that exits non-zero** may have hit its own turn or context limit,
  or given up on output it could not use (the agent's), or failed because the
  engine did (not the agent's). The gateway's records tell them apart: if the
  session's last call failed for an infrastructure reason
  (:func:`infrastructure_error`: engine HTTP 5xx, 408 or 429, timeout,
  unreachable, unreadable reply, the gateway stopped or failed) it is
  ``engine``; if the model never answered a call, ``harness``; else
  ``agent_exit``. A 4xx the engine gave the request (its context is too long)
  is the request's, so the agent's. The same holds for a harness that exits 0
  after its last call failed (``engine``, not scored) and for one that timed
  out retrying a failing engine (``engine``).
- **A session that hit a sandbox limit** (memory, processes, CPU time,
  ``/tmp``, disk) while the agent ran is the agent's: the limits are the task's
  resource budget, as the timeout is its time budget, and what runs in the
  sandbox then is the harness and the commands the model chose. Before the model
  answered any call it is the harness's (``harness``: a node whose limits are
  too small for the CLI itself); while the evaluator scored, ``evaluator``.
- **A session that timed out or hit a limit before the model answered any
  call** is ``harness``: no decision of the model's was involved.
- **A lost node** is ``node_lost``; a **cancelled** session is nobody's fault,
  masked and never resampled.
- **An older result** without a reason: ``timeout`` for TIMEOUT (what it meant
  then), ``cancelled`` for CANCELLED, ``unknown`` (masked, as every failure
  was before) for ERROR.

Trainers that normalise rewards over a group themselves (verl, slime, NeMo RL)
still see a masked session's placeholder reward in that group; see
:mod:`polar.bridges.rollouts`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, assert_never

from polar.ir import CallError, CompletionRecord, ErrorKind, RecordStatus

if TYPE_CHECKING:
    from polar.rollout.protocol import SessionResult


class Fault(StrEnum):
    """Whose failure a failed session is."""

    AGENT = "agent"
    """The model, acting through its harness: a result, trained and counted as 0."""
    INFRASTRUCTURE = "infrastructure"
    """Polar, the node, the engine, the sandbox set-up or the evaluator: masked."""
    NONE = "none"
    """Nobody's: the session was called off (cancelled). Masked."""


class FailureReason(StrEnum):
    """Why a session failed (see the module docstring's table)."""

    TIMEOUT = "timeout"
    AGENT_EXIT = "agent_exit"
    SANDBOX_LIMIT = "sandbox_limit"
    HARNESS = "harness"
    ENGINE = "engine"
    PREPARATION = "preparation"
    BUILD = "build"
    EVALUATOR = "evaluator"
    INTERNAL = "internal"
    NODE_LOST = "node_lost"
    REFUSED = "refused"
    UNKNOWN = "unknown"
    CANCELLED = "cancelled"

    @property
    def fault(self) -> Fault:
        match self:
            case FailureReason.TIMEOUT | FailureReason.AGENT_EXIT | FailureReason.SANDBOX_LIMIT:
                return Fault.AGENT
            case (
                FailureReason.HARNESS
                | FailureReason.ENGINE
                | FailureReason.PREPARATION
                | FailureReason.BUILD
                | FailureReason.EVALUATOR
                | FailureReason.INTERNAL
                | FailureReason.NODE_LOST
                | FailureReason.REFUSED
                | FailureReason.UNKNOWN
            ):
                return Fault.INFRASTRUCTURE
            case FailureReason.CANCELLED:
                return Fault.NONE
            case unreachable:
                assert_never(unreachable)


class SessionUse(StrEnum):
    """What a trainer and an evaluation do with a finished session."""

    SCORED = "scored"
    """Completed and scored: trained with its reward, counted with it."""
    FAILED = "failed"
    """The agent's failure: trained with reward 0.0 (its partial trajectory), counted as 0."""
    MASKED = "masked"
    """Not the agent's doing (or not scored): not trained, not counted."""


FAILED_REWARD = 0.0
"""The outcome reward of a session the agent failed."""


def session_use(result: SessionResult) -> SessionUse:
    """The policy: a completed session with a reward is scored; a failure is the
    agent's (trained and counted as :data:`FAILED_REWARD`) or masked, by its
    reason's fault. A completed session without a reward (no node reports one)
    has nothing to train towards: masked."""
    failure = result.failure
    if failure is None:
        return SessionUse.SCORED if result.reward is not None else SessionUse.MASKED
    match failure.fault:
        case Fault.AGENT:
            return SessionUse.FAILED
        case Fault.INFRASTRUCTURE | Fault.NONE:
            return SessionUse.MASKED
        case unreachable:
            assert_never(unreachable)


def outcome_reward(result: SessionResult) -> float | None:
    """The session's outcome reward under the policy: its score, :data:`FAILED_REWARD`
    for the agent's failure, None when it is masked."""
    match session_use(result):
        case SessionUse.SCORED:
            return result.reward
        case SessionUse.FAILED:
            return FAILED_REWARD
        case SessionUse.MASKED:
            return None
        case unreachable:
            assert_never(unreachable)


def replaceable(failure: FailureReason | None) -> bool:
    """Whether the rollout server may resample the session (``max_resamples``):
    only when the infrastructure failed it."""
    return failure is not None and failure.fault is Fault.INFRASTRUCTURE


# ---------------------------------------------------------------- the node's side


def infrastructure_error(record: CompletionRecord) -> CallError | None:
    """The error of a call that failed for a reason that is not the agent's
    (None: it completed, is still in flight, was cut off because the harness
    went away, or the engine refused the request itself with a 4xx)."""
    match record.status:
        case RecordStatus.COMPLETED | RecordStatus.ABORTED | RecordStatus.IN_FLIGHT:
            return None
        case RecordStatus.INTERRUPTED | RecordStatus.FAILED:
            error = record.error or CallError(ErrorKind.INTERNAL, "failed without a recorded error")
        case unknown_status:
            assert_never(unknown_status)
    match error.kind:
        case ErrorKind.CLIENT_DISCONNECTED | ErrorKind.SESSION_ENDED:
            return None  # the harness went away first: a consequence, not a cause
        case ErrorKind.ENGINE_HTTP:
            status = error.status
            refused = status is not None and 400 <= status < 500 and status not in (408, 429)
            return None if refused else error
        case (
            ErrorKind.ENGINE_TIMEOUT
            | ErrorKind.ENGINE_UNAVAILABLE
            | ErrorKind.ENGINE_PROTOCOL
            | ErrorKind.GATEWAY_STOPPED
            | ErrorKind.INTERNAL
        ):
            return error
        case unknown_kind:
            assert_never(unknown_kind)


@dataclass(frozen=True, slots=True)
class Calls:
    """What a session's records say about its model calls."""

    answered: int
    """Calls the engine finished and the harness was answered."""
    last_error: CallError | None
    """The session's last call's error, when it failed for an infrastructure reason."""

    @classmethod
    def of(cls, records: Sequence[CompletionRecord]) -> Calls:
        """Summarise the records (the last call: the highest ``seq``, its last attempt)."""
        answered = sum(1 for r in records if r.status is RecordStatus.COMPLETED)
        if not records:
            return cls(answered, None)
        last = max(records, key=lambda r: (r.seq, r.attempt))
        return cls(answered, infrastructure_error(last))


NO_CALLS = Calls(0, None)


@dataclass(frozen=True, slots=True)
class RunEnd:
    """How the run stage ended, as the node saw it."""

    exited_ok: bool
    """The harness exited 0 (neither timed out nor cancelled)."""
    timed_out: bool
    limit_hit: bool
    """The sandbox hit one of its limits while the agent ran."""
    calls: Calls


def run_failure(end: RunEnd) -> FailureReason | None:
    """Why the run stage failed, or None: the harness exited 0, its last call did not
    fail for an infrastructure reason, and no limit was hit (the session is scored).

    Precedence: an infrastructure error on the last call (``engine``) over anything
    the harness did next; then the harness's end, which is the agent's only if the
    model answered at least one call (``harness`` otherwise)."""
    if end.calls.last_error is not None:
        return FailureReason.ENGINE
    agent = end.calls.answered > 0
    if end.limit_hit:
        return FailureReason.SANDBOX_LIMIT if agent else FailureReason.HARNESS
    if end.timed_out:
        return FailureReason.TIMEOUT if agent else FailureReason.HARNESS
    if not end.exited_ok:
        return FailureReason.AGENT_EXIT if agent else FailureReason.HARNESS
    return None
