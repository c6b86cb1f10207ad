"""The rollout server's event stream through its real HTTP server and client:
event kinds arrive typed (:class:`EventKind`), under the wire names they have
always had, and a cancelled task's events end with ``task.finished``."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx

from polar.rollout.client import RolloutClient
from polar.rollout.config import ServerConfig
from polar.rollout.protocol import EventKind, HarnessSpec, NodeRegistration, TaskSubmission
from polar.rollout.server.app import create_server_app
from polar.rollout.server.service import RolloutServer
from polar.serverthread import ServerThread

from support.agents import agent_task, shell_harness
from support.rollout import CONTROL_TOKEN


def test_event_kinds_keep_their_wire_names() -> None:
    assert {kind.value for kind in EventKind} == {
        "task.submitted",
        "session.status",
        "session.result",
        "task.finished",
        "node.registered",
        "node.lost",
        "overflow",
    }


def test_a_cancelled_tasks_events_arrive_typed_and_end_with_task_finished(
    tmp_path: Path,
) -> None:
    """No node runs anything: the one registered node is drained, so the task's
    sessions stay queued until it is cancelled."""
    config = ServerConfig(port=0, db=tmp_path / "rollout.db", control_token=CONTROL_TOKEN)
    server = RolloutServer(config)
    seen: list[tuple[EventKind, dict[str, Any]]] = []
    with ServerThread(create_server_app(server)) as thread:
        server.public_url = thread.url

        def follow() -> None:
            with RolloutClient(thread.url, token=CONTROL_TOKEN) as client:
                for kind, data in client.events():
                    seen.append((kind, data))
                    if kind is EventKind.TASK_FINISHED:
                        return

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        registration = NodeRegistration(node_id="idle", url="http://127.0.0.1:9")
        auth = {"authorization": f"Bearer {CONTROL_TOKEN}"}
        with httpx.Client(base_url=thread.url, headers=auth, timeout=30) as http:
            # Register until the stream shows it: then the reader is subscribed.
            deadline = time.monotonic() + 30
            while not any(kind is EventKind.NODE_REGISTERED for kind, _ in seen):
                assert time.monotonic() < deadline, "the event stream never opened"
                http.post("/nodes/register", content=registration.model_dump_json())
                time.sleep(0.05)
            assert http.post("/nodes/idle/drain").status_code == 200
            with RolloutClient(thread.url, token=CONTROL_TOKEN) as client:
                view = client.submit(
                    TaskSubmission(
                        task=agent_task(tmp_path),
                        harness=HarnessSpec(**shell_harness("ok")),
                        num_samples=2,
                    )
                )
                client.cancel(view.task_id)
        reader.join(30)
        assert not reader.is_alive(), f"no task.finished among {seen}"

    mine = [(kind, data) for kind, data in seen if data.get("task_id") == view.task_id]
    assert [kind for kind, _ in mine] == [
        EventKind.TASK_SUBMITTED,
        EventKind.SESSION_STATUS,
        EventKind.SESSION_STATUS,
        EventKind.TASK_FINISHED,
    ]
    assert all(data["status"] == "cancelled" for _, data in mine[1:])
    assert mine[-1][1]["counts"] == {"cancelled": 2}
