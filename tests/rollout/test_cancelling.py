"""Cancelling a task while its sessions are being dispatched: a session cancelled
while still queued is never sent to a node afterwards.

The dispatcher takes the queued sessions, then sends them to nodes one at a time,
each send an HTTP request. A cancel arriving during one send marks the sessions
still queued cancelled; before the fix, the dispatcher went on down the list it
had read and sent those too (marking them dispatched over their cancellation), so
a cancelled task's sessions ran anyway and the task ended only when they did.

A real rollout server over HTTP; the node is a stand-in HTTP server (the outer
edge: it holds the first dispatch until the test has cancelled, records every
dispatch, and answers a session cancel as a node that no longer holds it)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar.rollout.client import RolloutClient
from polar.rollout.config import ServerConfig
from polar.rollout.protocol import (
    HarnessSpec,
    NodeRegistration,
    SessionStatus,
    TaskStatus,
    TaskSubmission,
)
from polar.rollout.server.app import create_server_app
from polar.rollout.server.service import RolloutServer
from polar.serverthread import ServerThread

from support.agents import agent_task, shell_harness
from support.rollout import CONTROL_TOKEN


class _HeldNode:
    """A node's ``/node`` API that holds the first dispatch until released."""

    def __init__(self) -> None:
        self.dispatched: list[str] = []
        self.first_arrived = threading.Event()
        self.release = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.path == "/node/sessions":
                    owner.dispatched.append(json.loads(body)["session_id"])
                    if len(owner.dispatched) == 1:
                        owner.first_arrived.set()
                        owner.release.wait(30)
                    self._answer(201, {"status": "accepted"})
                else:  # /node/sessions/{id}/cancel
                    self._answer(404, {"error": {"type": "not_found", "message": "gone"}})

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def node() -> Iterator[_HeldNode]:
    held = _HeldNode()
    yield held
    held.close()


def test_sessions_cancelled_during_a_dispatch_are_never_sent(
    tmp_path: Path, node: _HeldNode
) -> None:
    config = ServerConfig(port=0, db=tmp_path / "rollout.db", control_token=CONTROL_TOKEN)
    server = RolloutServer(config)
    with ServerThread(create_server_app(server)) as thread:
        server.public_url = thread.url
        auth = {"authorization": f"Bearer {CONTROL_TOKEN}"}
        registration = NodeRegistration(node_id="held", url=node.url)
        reply = httpx.post(
            f"{thread.url}/nodes/register",
            content=registration.model_dump_json(),
            headers=auth,
            timeout=30,
        )
        assert reply.status_code == 200, reply.text
        with RolloutClient(thread.url, token=CONTROL_TOKEN) as client:
            submission = TaskSubmission(
                task=agent_task(tmp_path),
                harness=HarnessSpec(**shell_harness("ok")),
                num_samples=3,
            )
            task_id = client.submit(submission).task_id
            assert node.first_arrived.wait(30), "no session was dispatched"
            client.cancel(task_id)  # while the first dispatch is held
            node.release.set()
            deadline = time.monotonic() + 30
            while client.task(task_id).status is TaskStatus.RUNNING:
                assert time.monotonic() < deadline, client.task(task_id)
                time.sleep(0.1)
            view = client.task(task_id)
    assert view.status is TaskStatus.CANCELLED
    assert len(node.dispatched) == 1, node.dispatched
    held = node.dispatched[0]
    statuses = {s.session_id: s.status for s in view.sessions}
    assert all(
        status is SessionStatus.CANCELLED for sid, status in statuses.items() if sid != held
    ), statuses
