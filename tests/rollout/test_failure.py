"""The failed-session policy (``polar.rollout.failure``): how the node judges the
run stage from the harness's end and the gateway's records, what each reason
means for trainers, and that results and databases written before reasons
existed still read (with the reason their status meant)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from polar.ir import (
    CallError,
    CaptureMode,
    CompletionRecord,
    Dialect,
    ErrorKind,
    RecordStatus,
    Timings,
)
from polar.rollout.failure import (
    Calls,
    FailureReason,
    Fault,
    RunEnd,
    SessionUse,
    infrastructure_error,
    outcome_reward,
    replaceable,
    run_failure,
    session_use,
)
from polar.rollout.protocol import (
    HarnessSpec,
    SessionResult,
    SessionStatus,
    TaskSubmission,
)
from polar.rollout.server.store import SCHEMA, RolloutStore
from polar.tasks.model import DirectoryWorkspace, EvaluatorSpec, Task


def record(
    seq: int,
    status: RecordStatus = RecordStatus.COMPLETED,
    error: CallError | None = None,
    attempt: int = 1,
) -> CompletionRecord:
    return CompletionRecord(
        session_id="s",
        seq=seq,
        attempt=attempt,
        status=status,
        dialect=Dialect.OPENAI_CHAT,
        capture=CaptureMode.TOKEN_IN_TOKEN_OUT,
        engine="scripted",
        model="m",
        policy_version=0,
        stream=False,
        original_request={},
        engine_request={},
        timings=Timings(arrived=float(seq)),
        error=error,
    )


def failed(kind: ErrorKind, status: int | None = None) -> CompletionRecord:
    return record(9, RecordStatus.FAILED, CallError(kind, "it failed", status))


# ---------------------------------------------------------------- calls


@pytest.mark.parametrize(
    ("last", "infrastructure"),
    [
        (record(9), False),
        (failed(ErrorKind.ENGINE_HTTP, 502), True),
        (failed(ErrorKind.ENGINE_HTTP, 429), True),
        (failed(ErrorKind.ENGINE_HTTP, 408), True),
        (failed(ErrorKind.ENGINE_HTTP, None), True),
        (failed(ErrorKind.ENGINE_HTTP, 400), False),  # the request: its context is too long
        (failed(ErrorKind.ENGINE_TIMEOUT), True),
        (failed(ErrorKind.ENGINE_UNAVAILABLE), True),
        (failed(ErrorKind.ENGINE_PROTOCOL), True),
        (failed(ErrorKind.INTERNAL), True),
        (record(9, RecordStatus.FAILED), True),  # failed, its error not recorded
        (record(9, RecordStatus.INTERRUPTED, CallError(ErrorKind.GATEWAY_STOPPED, "x")), True),
        (record(9, RecordStatus.ABORTED, CallError(ErrorKind.SESSION_ENDED, "x")), False),
        (record(9, RecordStatus.ABORTED, CallError(ErrorKind.CLIENT_DISCONNECTED, "x")), False),
        (record(9, RecordStatus.IN_FLIGHT), False),
    ],
)
def test_a_call_fails_the_infrastructure_unless_the_request_or_the_harness_ended_it(
    last: CompletionRecord, infrastructure: bool
) -> None:
    assert (infrastructure_error(last) is not None) is infrastructure
    calls = Calls.of([record(1), last])
    assert (calls.last_error is not None) is infrastructure


def test_only_the_sessions_last_call_counts_and_a_retry_that_succeeded_clears_it() -> None:
    early = record(1, RecordStatus.FAILED, CallError(ErrorKind.ENGINE_TIMEOUT, "slow"))
    assert Calls.of([early, record(2)]) == Calls(1, None)
    retried = [
        record(3, RecordStatus.FAILED, CallError(ErrorKind.ENGINE_UNAVAILABLE, "down")),
        record(3, attempt=2),
    ]
    assert Calls.of(list(reversed(retried))) == Calls(1, None)
    assert Calls.of([]) == Calls(0, None)


# ---------------------------------------------------------------- the run stage

ANSWERED = Calls(2, None)
NONE_ANSWERED = Calls(0, None)
ENGINE_DOWN = Calls(1, CallError(ErrorKind.ENGINE_UNAVAILABLE, "refused"))


@pytest.mark.parametrize(
    ("end", "reason"),
    [
        (RunEnd(exited_ok=True, timed_out=False, limit_hit=False, calls=ANSWERED), None),
        (RunEnd(exited_ok=True, timed_out=False, limit_hit=False, calls=NONE_ANSWERED), None),
        (
            RunEnd(exited_ok=False, timed_out=True, limit_hit=False, calls=ANSWERED),
            FailureReason.TIMEOUT,
        ),
        (
            RunEnd(exited_ok=False, timed_out=True, limit_hit=False, calls=NONE_ANSWERED),
            FailureReason.HARNESS,
        ),
        (
            RunEnd(exited_ok=False, timed_out=False, limit_hit=False, calls=ANSWERED),
            FailureReason.AGENT_EXIT,
        ),
        (
            RunEnd(exited_ok=False, timed_out=False, limit_hit=False, calls=NONE_ANSWERED),
            FailureReason.HARNESS,
        ),
        (
            RunEnd(exited_ok=False, timed_out=False, limit_hit=True, calls=ANSWERED),
            FailureReason.SANDBOX_LIMIT,
        ),
        (
            RunEnd(exited_ok=False, timed_out=True, limit_hit=True, calls=NONE_ANSWERED),
            FailureReason.HARNESS,
        ),
        # The engine failed the last call: whatever the harness did next.
        (
            RunEnd(exited_ok=False, timed_out=False, limit_hit=False, calls=ENGINE_DOWN),
            FailureReason.ENGINE,
        ),
        (
            RunEnd(exited_ok=False, timed_out=True, limit_hit=False, calls=ENGINE_DOWN),
            FailureReason.ENGINE,
        ),
        (
            RunEnd(exited_ok=True, timed_out=False, limit_hit=False, calls=ENGINE_DOWN),
            FailureReason.ENGINE,
        ),
    ],
)
def test_how_a_run_ended_decides_whose_failure_it_is(
    end: RunEnd, reason: FailureReason | None
) -> None:
    assert run_failure(end) is reason


# ---------------------------------------------------------------- what consumers do


def result(
    status: SessionStatus, failure: FailureReason | None = None, reward: float | None = None
) -> SessionResult:
    return SessionResult(
        session_id="s",
        task_id="t",
        sample_index=0,
        status=status,
        failure=failure,
        reward=reward,
    )


AGENT = {FailureReason.TIMEOUT, FailureReason.AGENT_EXIT, FailureReason.SANDBOX_LIMIT}


@pytest.mark.parametrize("reason", list(FailureReason))
def test_the_agents_failures_train_as_zero_and_the_rest_are_masked(reason: FailureReason) -> None:
    status = SessionStatus.TIMEOUT if reason is FailureReason.TIMEOUT else SessionStatus.ERROR
    session = result(status, reason)
    if reason in AGENT:
        assert reason.fault is Fault.AGENT
        assert (session_use(session), outcome_reward(session)) == (SessionUse.FAILED, 0.0)
    else:
        assert (session_use(session), outcome_reward(session)) == (SessionUse.MASKED, None)
    # Only the infrastructure's failures are resampled; never a cancelled session.
    assert replaceable(reason) is (reason.fault is Fault.INFRASTRUCTURE)
    assert replaceable(FailureReason.CANCELLED) is False


def test_a_completed_session_is_scored_and_has_no_failure() -> None:
    done = result(SessionStatus.COMPLETED, reward=0.25)
    assert (session_use(done), outcome_reward(done), replaceable(done.failure)) == (
        SessionUse.SCORED,
        0.25,
        False,
    )
    assert session_use(result(SessionStatus.COMPLETED)) is SessionUse.MASKED  # never scored
    with pytest.raises(ValueError, match="a completed session has no failure"):
        result(SessionStatus.COMPLETED, FailureReason.TIMEOUT, reward=1.0)


# ---------------------------------------------------------------- older results


OLDER = {"session_id": "s", "task_id": "t", "sample_index": 0, "reward": None, "samples": []}


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        ("timeout", FailureReason.TIMEOUT),
        ("cancelled", FailureReason.CANCELLED),
        ("error", FailureReason.UNKNOWN),
        ("completed", None),
    ],
)
def test_a_result_stored_before_reasons_existed_reads_with_what_its_status_meant(
    status: str, reason: FailureReason | None
) -> None:
    parsed = SessionResult.model_validate_json(json.dumps({**OLDER, "status": status}))
    assert parsed.failure is reason
    again = SessionResult.model_validate_json(parsed.model_dump_json())
    assert again == parsed


def test_an_older_servers_database_opens_and_its_ended_sessions_read(tmp_path: Path) -> None:
    db = tmp_path / "rollout.db"
    older = SCHEMA.replace("    failure TEXT,\n", "")
    assert older != SCHEMA
    task = Task(
        id="x",
        instruction="do x",
        workspace=DirectoryWorkspace(path=tmp_path),
        evaluator=EvaluatorSpec(kind="command", config={"command": "true"}),
    )
    submission = TaskSubmission(task=task, harness=HarnessSpec(name="shell"), num_samples=2)
    with sqlite3.connect(db) as conn:
        conn.executescript(older)
        conn.execute(
            "INSERT INTO tasks (task_id, submission, status, created_at) VALUES (?, ?, ?, ?)",
            ("t1", submission.model_dump_json(), "completed", 1.0),
        )
        lost = ("t1-s0", "t1", 0, "error", 1.0, "node a stopped answering")
        conn.execute(
            "INSERT INTO sessions (session_id, task_id, sample_index, status, updated_at, error)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            lost,
        )
        old_result = {**OLDER, "session_id": "t1-s1", "task_id": "t1", "sample_index": 1}
        conn.execute(
            "INSERT INTO sessions (session_id, task_id, sample_index, status, updated_at, result)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            ("t1-s1", "t1", 1, "timeout", 1.0, json.dumps({**old_result, "status": "timeout"})),
        )
    store = RolloutStore(db)
    try:
        stored = store.result("t1")
        view = store.view("t1")
    finally:
        store.close()
    assert stored is not None and view is not None
    assert [r.failure for r in stored.results] == [FailureReason.UNKNOWN, FailureReason.TIMEOUT]
    assert [s.failure for s in view.sessions] == [FailureReason.UNKNOWN, FailureReason.TIMEOUT]
    assert [session_use(r) for r in stored.results] == [SessionUse.MASKED, SessionUse.FAILED]
