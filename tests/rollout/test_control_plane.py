"""The rollout service's control plane through its real HTTP servers: the node's
API apart from its gateway, tokens that are never optional and compared as
bytes, per-task read tokens, signed callbacks that carry no token, and a node
that refuses a dispatch its operator's policy does not allow."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar.rollout.callbacks import InvalidSignature, verify
from polar.rollout.protocol import HarnessSpec, SessionDispatch, SessionStatus, TaskSubmission
from polar.runtime.base import RuntimeSpec
from polar.tasks.model import EvaluatorSpec

from support.agents import agent_task, shell_harness
from support.rollout import CONTROL_TOKEN, RolloutStack

HELLO = {"sessions": [{"turns": [{"text": "hello"}]}]}


def bearer(token: str | bytes) -> dict[str, bytes]:
    raw = token if isinstance(token, bytes) else token.encode()
    return {"authorization": b"Bearer " + raw}


def test_the_node_api_is_apart_from_the_gateway_and_wants_the_token(
    make_rollout: Callable[..., RolloutStack],
) -> None:
    stack = make_rollout(HELLO)
    node, gateway = stack.node_thread.control_url, stack.node_thread.gateway_url
    wrong = [
        {},
        bearer("wrong-token-0123456789"),
        bearer(CONTROL_TOKEN[:-1]),
        bearer("tökén-with-ümlauts-0123456789".encode()),
        bearer(b"\xff\xfe" + CONTROL_TOKEN.encode()),
        {"authorization": f"Basic {CONTROL_TOKEN}".encode()},
    ]
    with httpx.Client(timeout=30) as http:
        for headers in wrong:
            for url in (f"{node}/node/sessions", f"{node}/node/health", f"{stack.url}/tasks"):
                reply = http.get(url, headers=headers)
                assert reply.status_code == 401, (url, headers, reply.text)
                assert reply.json()["error"]["type"] == "unauthorized"
        assert http.get(f"{node}/health").json() == {"status": "ok"}
        assert http.get(f"{node}/node/health", headers=bearer(CONTROL_TOKEN)).status_code == 200
        # The gateway's port (the one sandboxes reach) has no node routes at all.
        for path in ("/node/sessions", "/node/health"):
            assert http.get(f"{gateway}{path}", headers=bearer(CONTROL_TOKEN)).status_code == 404


class _Receiver:
    """A callback URL: records each POST's headers and body."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, str], bytes]] = []
        self.arrived = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                owner.calls.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(204)
                self.end_headers()
                owner.arrived.set()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/done"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    r = _Receiver()
    yield r
    r.close()


def test_callbacks_are_signed_and_read_tokens_read_one_task(
    make_rollout: Callable[..., RolloutStack], tmp_path: Path, receiver: _Receiver
) -> None:
    """Two tasks: one signed with the control token (no ``callback_secret``), one with
    the submitter's own secret. Neither callback carries a token or the secret. Each
    task's read token (shown once, at submission) reads that task and nothing else."""
    stack = make_rollout({"sessions": [{"turns": [{"text": "hello"}]}] * 2})
    own = "a-submitters-own-secret-0123"
    keys: dict[str, str] = {}
    views = []
    with stack.client() as client:
        for secret in (None, own):
            submission = TaskSubmission(
                task=agent_task(tmp_path),
                harness=HarnessSpec(**shell_harness("ok")),
                callback_url=receiver.url,
                callback_secret=secret,
            )
            view = client.submit(submission)
            views.append(view)
            keys[view.task_id] = secret or CONTROL_TOKEN
        for task_id in keys:
            client.wait(task_id, timeout_s=120)
            assert client.task(task_id).access_token is None
        shown = client._http.get("/tasks").text
    deadline = time.monotonic() + 30
    while len(receiver.calls) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)

    assert len(receiver.calls) == 2
    for headers, body in receiver.calls:
        key = keys[json.loads(body)["task_id"]]
        verify(body, headers, key)
        assert "authorization" not in headers
        everything = json.dumps(headers) + body.decode()
        assert CONTROL_TOKEN not in everything and own not in everything
        with pytest.raises(InvalidSignature):
            verify(body + b" ", headers, key)
        with pytest.raises(InvalidSignature):
            verify(body, headers, "another-secret-0123456789")
    assert own not in shown

    mine, other = views
    assert mine.access_token is not None
    read = bearer(mine.access_token)
    with httpx.Client(base_url=stack.url, timeout=30) as http:
        assert http.get(f"/tasks/{mine.task_id}", headers=read).status_code == 200
        assert http.get(f"/tasks/{mine.task_id}/result", headers=read).status_code == 200
        for method, path in [
            ("GET", f"/tasks/{other.task_id}"),
            ("GET", f"/tasks/{other.task_id}/result"),
            ("GET", "/tasks"),
            ("GET", "/nodes"),
            ("GET", "/events"),
            ("POST", f"/tasks/{mine.task_id}/cancel"),
            ("POST", "/tasks"),
        ]:
            assert http.request(method, path, headers=read).status_code == 401, path


def test_the_node_refuses_what_its_policy_does_not_allow(
    make_rollout: Callable[..., RolloutStack], tmp_path: Path
) -> None:
    """Asked directly (with the control token), the node answers 403 naming what is
    not allowed, runs nothing, and keeps serving."""
    stack = make_rollout(HELLO)
    marker = tmp_path / "ran-on-the-host"
    base = {
        "session_id": "x-s0",
        "task_id": "x",
        "sample_index": 0,
        "builder": "per_request",
        "session_timeout_s": 60,
        "group_id": "x",
        "harness": {"name": "shell", "options": {"command": f"touch {marker}"}},
    }
    loosened = {
        "sandbox: false": {"runtime": RuntimeSpec(sandbox=False)},
        "network: host": {"runtime": RuntimeSpec(network="host")},
        "mount host paths": {"runtime": RuntimeSpec(mounts=[{"path": "/"}])},
        "runtime options": {"runtime": RuntimeSpec(options={"bwrap": "/bin/sh"})},
        "runtime.memory_mb": {"runtime": RuntimeSpec(memory_mb=10**6)},
        "runtime.owner": {"runtime": RuntimeSpec(owner="node-b")},
        "plug-in": {"evaluator": EvaluatorSpec(kind="os:system")},
    }
    with httpx.Client(base_url=stack.node_thread.control_url, timeout=30) as http:
        for reason, change in loosened.items():
            task = agent_task(tmp_path).model_copy(update=change)
            dispatch = SessionDispatch.model_validate({**base, "task": task})
            reply = http.post(
                "/node/sessions",
                content=dispatch.model_dump_json(),
                headers=bearer(CONTROL_TOKEN),
            )
            assert reply.status_code == 403, (reason, reply.text)
            assert reason in reply.json()["error"]["message"], reply.text
        listed = http.get("/node/sessions", headers=bearer(CONTROL_TOKEN)).json()
    assert not marker.exists()
    assert listed == {}
    with stack.client() as client:
        ok = client.submit(
            TaskSubmission(task=agent_task(tmp_path), harness=HarnessSpec(**shell_harness("ok")))
        )
        result = client.wait(ok.task_id, timeout_s=120)
    assert result.results[0].status is SessionStatus.COMPLETED
