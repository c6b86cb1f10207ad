"""The rollout feed's end: closing cancels the groups still generating and never
waits longer than one poll for them, also when the server does not finish a
cancelled group. A real rollout server over HTTP with no node registered, so
every submitted group stays queued until it is cancelled; the one fake is a
cancellation that never reaches the server (``RolloutClient.cancel`` patched to
fail as an unreachable server does)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from polar.rollout.client import RolloutClient, RolloutError
from polar.rollout.config import ServerConfig
from polar.rollout.protocol import HarnessSpec, TaskStatus
from polar.rollout.server.app import create_server_app
from polar.rollout.server.service import RolloutServer
from polar.serverthread import ServerThread
from polar.train.feed import CLOSE_POLL_S, GroupRequest, RolloutFeed, task_order

from support.agents import agent_task, shell_harness
from support.rollout import CONTROL_TOKEN


@pytest.fixture
def server_url(tmp_path: Path) -> Iterator[str]:
    config = ServerConfig(port=0, db=tmp_path / "rollout.db", control_token=CONTROL_TOKEN)
    server = RolloutServer(config)
    with ServerThread(create_server_app(server)) as thread:
        server.public_url = thread.url
        yield thread.url


def feed_of(url: str, root: Path) -> RolloutFeed:
    tasks = [agent_task(root, task_id=f"t{i}") for i in range(3)]
    request = GroupRequest(
        harness=HarnessSpec(**shell_harness("ok")),
        group_size=2,
        builder="prefix_merge",
        session_timeout_s=60,
        max_resamples=0,
        wait_s=600,  # a group's own time limit: far longer than a close may take
    )
    return RolloutFeed(
        lambda: RolloutClient(url, token=CONTROL_TOKEN),
        task_order(tasks, seed=0, shuffle=False),
        request,
        inflight=2,
    )


def test_closing_cancels_the_groups_still_generating(server_url: str, tmp_path: Path) -> None:
    feed = feed_of(server_url, tmp_path)
    feed.fill(policy_version=1)
    assert feed.pending == 2
    started = time.monotonic()
    left = feed.close()
    took = time.monotonic() - started
    assert len(left) == 2
    with RolloutClient(server_url, token=CONTROL_TOKEN) as client:
        assert {client.task(task_id).status for task_id in left} == {TaskStatus.CANCELLED}
    assert took < CLOSE_POLL_S + 10, took


def test_a_group_the_server_never_finishes_holds_a_close_for_one_poll_at_most(
    server_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    feed = feed_of(server_url, tmp_path)
    feed.fill(policy_version=1)

    def unreachable(self: RolloutClient, task_id: str) -> None:
        raise RolloutError(0, "rollout server unreachable: (the test's)")

    monkeypatch.setattr(RolloutClient, "cancel", unreachable)
    started = time.monotonic()
    left = feed.close()
    took = time.monotonic() - started
    assert len(left) == 2
    # before: the close waited out the groups' own limit (wait_s, 600 s here)
    assert took < CLOSE_POLL_S + 10, took
    with RolloutClient(server_url, token=CONTROL_TOKEN) as client:
        assert {client.task(task_id).status for task_id in left} == {TaskStatus.RUNNING}
