"""Every refusal of the rollout server's API, status and body exactly: the domain's
typed errors (:mod:`polar.rollout.server.errors`) and the HTTP layer's own, all answered as
``{"error": {"type", "message"}}`` by :mod:`polar.rollout.server.app`. A real
server over HTTP; no node process (its side is spoken with plain requests)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar.rollout.config import ServerConfig
from polar.rollout.protocol import HarnessSpec, TaskSubmission
from polar.rollout.server.app import ANSWERS, create_server_app
from polar.rollout.server.errors import RolloutServerError
from polar.rollout.server.service import RolloutServer
from polar.serverthread import ServerThread

from support.agents import agent_task, shell_harness
from support.rollout import CONTROL_TOKEN

AUTH = {"authorization": f"Bearer {CONTROL_TOKEN}"}


@pytest.fixture
def http(tmp_path: Path) -> Iterator[httpx.Client]:
    config = ServerConfig(port=0, db=tmp_path / "rollout.db", control_token=CONTROL_TOKEN)
    server = RolloutServer(config)
    with ServerThread(create_server_app(server)) as thread:
        server.public_url = thread.url
        with httpx.Client(base_url=thread.url, headers=AUTH, timeout=30) as client:
            yield client


def error(kind: str, message: str) -> dict[str, Any]:
    return {"error": {"type": kind, "message": message}}


def submission(root: Path, **fields: Any) -> str:
    task = TaskSubmission(
        task=agent_task(root), harness=HarnessSpec(**shell_harness("ok")), num_samples=1
    )
    return task.model_copy(update=fields).model_dump_json()


def test_unknown_tasks_nodes_sessions_and_files_are_404s(http: httpx.Client) -> None:
    refusals = [
        (http.get("/tasks/t-nope"), error("not_found", "no task t-nope")),
        (http.get("/tasks/t-nope/result"), error("not_found", "no task t-nope")),
        (http.post("/tasks/t-nope/cancel"), error("not_found", "no task t-nope")),
        (http.get("/tasks/t-nope/events"), error("not_found", "no task t-nope")),
        (
            http.post("/nodes/ghost/heartbeat", json={"sessions": {}}),
            error("not_found", "node ghost is not registered"),
        ),
        (http.post("/nodes/ghost/drain"), error("not_found", "node ghost is not registered")),
        (http.get("/files/" + "a" * 64), error("not_found", "no task file " + "a" * 64)),
        (http.get("/nope"), error("not_found", "GET /nope")),
        (
            http.post(
                "/callbacks/sessions",
                json={"session_id": "s-x", "task_id": "t-x", "sample_index": 0, "status": "error"},
            ),
            # Not "not_found": the type this answer has always had.
            error("invalid_request", "no session s-x of task t-x"),
        ),
    ]
    for reply, body in refusals:
        assert (reply.status_code, reply.json()) == (404, body), reply.request.url


def test_a_taken_task_id_is_a_409_conflict(http: httpx.Client, tmp_path: Path) -> None:
    body = submission(tmp_path, task_id="t-mine")
    assert http.post("/tasks", content=body).status_code == 201
    reply = http.post("/tasks", content=body)
    assert (reply.status_code, reply.json()) == (
        409,
        error("conflict", "task t-mine already exists"),
    )


def test_submissions_that_could_not_run_are_422s_naming_the_field(
    http: httpx.Client, tmp_path: Path
) -> None:
    unknown = http.post("/tasks", content=submission(tmp_path, harness=HarnessSpec(name="nope")))
    assert unknown.status_code == 422
    assert unknown.json()["error"]["type"] == "invalid_request"
    assert unknown.json()["error"]["message"].startswith("harness.name: ")

    no_command = http.post(
        "/tasks", content=submission(tmp_path, harness=HarnessSpec(name="shell"))
    )
    assert no_command.status_code == 422
    assert no_command.json()["error"]["type"] == "invalid_request"
    assert no_command.json()["error"]["message"].startswith("harness.options: ")

    gone = tmp_path / "gone"
    body = submission(gone)
    shutil.rmtree(gone)
    unreadable = http.post("/tasks", content=body)
    workspace = gone / "t-workspace"
    assert (unreadable.status_code, unreadable.json()) == (
        422,
        error(
            "invalid_request",
            f"task.workspace.path: {workspace} is not a directory the rollout server can read",
        ),
    )


def test_a_result_with_a_status_that_is_not_final_is_a_422(
    http: httpx.Client, tmp_path: Path
) -> None:
    created = http.post("/tasks", content=submission(tmp_path))
    task_id = created.json()["task_id"]
    (session,) = http.get(f"/tasks/{task_id}").json()["sessions"]
    result = {
        "session_id": session["session_id"],
        "task_id": task_id,
        "sample_index": 0,
        "status": "running",
    }
    reply = http.post("/callbacks/sessions", json=result)
    assert (reply.status_code, reply.json()) == (
        422,
        error("invalid_request", "status running is not a final status"),
    )


def test_bad_queries_are_400s_and_bad_tokens_401s(http: httpx.Client, tmp_path: Path) -> None:
    task_id = http.post("/tasks", content=submission(tmp_path)).json()["task_id"]
    refusals = [
        (http.get("/tasks", params={"status": "bogus"}), 400, "unknown status 'bogus'"),
        (
            http.get(f"/tasks/{task_id}/result", params={"wait": "soon"}),
            400,
            "wait must be a number of seconds, not 'soon'",
        ),
        (
            http.get(f"/tasks/{task_id}/result", params={"wait": "301"}),
            400,
            "wait must be between 0 and 300 seconds",
        ),
        (http.post("/tasks", content=b"[1]"), 400, "the body must be a JSON object"),
    ]
    for reply, status, message in refusals:
        assert (reply.status_code, reply.json()) == (status, error("invalid_request", message))

    wrong = {"authorization": "Bearer not-the-token"}
    read = http.get(f"/tasks/{task_id}", headers=wrong)
    assert (read.status_code, read.json()) == (
        401,
        error("unauthorized", "missing or wrong token"),
    )
    control = http.get("/nodes", headers=wrong)
    assert (control.status_code, control.json()) == (
        401,
        error("unauthorized", "missing or wrong control token"),
    )


def test_every_domain_error_has_one_answer() -> None:
    assert set(RolloutServerError.__subclasses__()) == set(ANSWERS)
