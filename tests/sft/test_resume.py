"""Resuming against a rollout server that outlived the generator (``--server-url``):
an attempt the earlier run submitted is waited on, not run again; one the
server never got is submitted under a new id; nothing is counted twice. Real
rollout server and node; the agent is the ``shell`` harness making no model
call (the resume logic does not depend on what the agent does)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from polar.rollout.protocol import HarnessSpec, TaskSubmission
from polar.sft.generate import GenerateConfig, Generation, rollout_task_id
from polar.sft.journal import Journal
from polar.sft.verdict import AttemptKey, FilterReason

from support.agents import agent_task
from support.rollout import RolloutStack


@pytest.fixture
def stack(tmp_path: Path, tokenizer: Any) -> Iterator[RolloutStack]:
    stack = RolloutStack(tmp_path / "rollout", tokenizer, {"turns": []})
    yield stack
    stack.close()


def test_a_rerun_waits_on_what_the_server_still_has_and_resubmits_what_it_lost(
    stack: RolloutStack, tmp_path: Path
) -> None:
    task = agent_task(tmp_path)
    harness = HarnessSpec(name="shell", options={"command": "touch done"})
    config = GenerateConfig(out=tmp_path / "out", harness=harness, attempts=3, dedupe=False)

    # An earlier run, killed: attempt 0 reached the server, attempt 1 did not.
    with Journal(
        config.out / "journal.sqlite", settings=config.settings, tasks=[task], server=stack.url
    ) as journal:
        run_id = journal.run_id
        kept, lost = AttemptKey(task.id, 0), AttemptKey(task.id, 1)
        journal.submitted(kept, rollout_task_id(run_id, kept))
        journal.submitted(lost, rollout_task_id(run_id, lost))
    with stack.client() as client:
        client.submit(
            TaskSubmission(
                task=task, harness=harness, task_id=rollout_task_id(run_id, kept), num_samples=1
            )
        )
        with Generation(config, [task], reattach=True, server=stack.url) as generation:
            report = generation.run(client)
        on_server = sorted(t.task_id for t in client.tasks())

    assert not report.interrupted and report.incarnation == 2
    assert on_server == [
        f"{run_id}.t.a0",  # the earlier run's, waited on
        f"{run_id}.t.a1.r2",  # lost: submitted again by run 2
        f"{run_id}.t.a2",
    ]
    overall = report.stats.overall
    assert (overall.planned, overall.attempts) == (3, 3)
    # The agent made no model call: completed, rewarded, and nothing to export.
    assert overall.filtered[FilterReason.NO_TRACES] == 3
