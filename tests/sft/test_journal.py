"""The generation journal: a result is kept once, what an earlier run left in
flight is listed, and a rerun with other settings or changed tasks is refused
before it touches anything."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

import pytest

from polar.rollout.protocol import SessionResult, SessionStatus
from polar.sft.journal import Journal, JournalError, Pending, RunSettings
from polar.sft.verdict import AttemptKey, summarize
from polar.tasks.builtin import builtin_task

SETTINGS = RunSettings(harness='{"name":"qwen_code"}', builder="prefix_merge", session_timeout_s=60)
TASKS = [builtin_task("fix-median")]


def result(session: str, reward: float) -> SessionResult:
    return SessionResult(
        session_id=session,
        task_id=session.removesuffix("-s0"),
        sample_index=0,
        status=SessionStatus.COMPLETED,
        reward=reward,
    )


def open_journal(path: Path, **changes: object) -> Journal:
    settings = dataclasses.replace(SETTINGS, **changes)  # type: ignore[arg-type]
    return Journal(path, settings=settings, tasks=TASKS, server="local")


def test_a_result_is_kept_once_and_survives_reopening(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    key = AttemptKey("fix-median", 0)
    with open_journal(path) as journal:
        run_id = journal.run_id
        journal.submitted(key, "sft.fix-median.a0")
        first = result("sft.fix-median.a0-s0", 1.0)
        assert journal.finish(key, first, summarize(first)) is True
        late = result("sft.fix-median.a0.r2-s0", 0.0)
        assert journal.finish(key, late, summarize(late)) is False, "never counted twice"
        journal.submitted(key, "other")  # a done attempt is not reopened
    with open_journal(path) as journal:
        assert journal.run_id == run_id
        assert journal.incarnation == 2
        assert journal.result(key) == first
        assert journal.summaries() == {key: summarize(first)}
        assert journal.rollout_ids() == {key: "sft.fix-median.a0"}
        assert journal.pending() == []


def test_attempts_an_earlier_run_left_in_flight_are_pending(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    with open_journal(path) as journal:
        journal.submitted(AttemptKey("fix-median", 1), "sft.fix-median.a1")
        journal.submitted(AttemptKey("fix-median", 0), "sft.fix-median.a0")
        assert journal.pending() == [], "this run's own attempts are not pending"
    with open_journal(path) as journal:
        assert journal.pending() == [
            Pending(AttemptKey("fix-median", 0), "sft.fix-median.a0", 1),
            Pending(AttemptKey("fix-median", 1), "sft.fix-median.a1", 1),
        ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"builder": "per_request"}, "this run used builder prefix_merge, not per_request"),
        ({"session_timeout_s": 30}, "this run used session_timeout_s 60, not 30"),
    ],
)
def test_a_rerun_with_other_settings_is_refused(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    path = tmp_path / "journal.sqlite"
    open_journal(path).close()
    with pytest.raises(JournalError, match=message):
        open_journal(path, **change)
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT COUNT(*) FROM runs").fetchone() == (1,), "nothing changed"


def test_a_task_whose_definition_changed_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    open_journal(path).close()
    changed = TASKS[0].model_copy(update={"instruction": "Something else."})
    with pytest.raises(JournalError, match="task fix-median is not the task this run started"):
        Journal(path, settings=SETTINGS, tasks=[changed], server="local")
    more = [*TASKS, builtin_task("fix-slugify")]
    Journal(path, settings=SETTINGS, tasks=more, server="local").close()  # new tasks may join


def test_a_file_that_is_not_a_journal_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    path.write_bytes(b"this is not SQLite" * 100)
    with pytest.raises(JournalError, match="not a usable journal"):
        open_journal(path)
