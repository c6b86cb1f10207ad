"""``polar gateway --workers 2`` end to end: a real group (parent, router, two
worker processes) on one port, real HTTP, token-in/token-out capture against
the scripted engine (a real HTTP server in this process, standing in for vLLM:
no model runs here).

One group serves the three tests of this module (start-up is the expensive
part); the last one kills a worker, which the group restarts.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar.ir import CompletionRecord, PromptOrigin, RecordStatus
from polar.proxy.dialects.anthropic_messages.translate import error_json as anthropic_error
from polar.proxy.dialects.gemini.translate import error_json as gemini_error
from polar.proxy.dialects.openai_errors import error_json as openai_error
from polar.proxy.engines.vllm_process import free_port
from polar.proxy.errors import AuthenticationFailed
from polar.proxy.store import SqliteStore
from polar.proxy.workers.affinity import owner_of
from polar.testing.scripted import ScriptedEngine
from polar.testing.scripted.script import script_from_dict

ADMIN = "workers-admin-token-0123456789"
SLOW_TEXT = " ".join(f"word{i}" for i in range(150))


class Group:
    def __init__(self, url: str, db: Path, engine: ScriptedEngine) -> None:
        self.url = url
        self.db = db
        self.engine = engine
        self.admin = httpx.Client(
            base_url=url, headers={"authorization": f"Bearer {ADMIN}"}, timeout=60
        )
        # One keep-alive connection for every session's calls: it switches workers.
        self.calls = httpx.Client(base_url=url, timeout=60)

    def new_session(self, session_id: str | None = None) -> tuple[str, str]:
        body = {} if session_id is None else {"session_id": session_id}
        reply = self.admin.post("/admin/sessions", json=body)
        assert reply.status_code == 201, reply.text
        return reply.json()["session_id"], reply.json()["api_key"]

    def chat(
        self, key: str, messages: list[dict[str, Any]], *, stream: bool = False
    ) -> httpx.Response:
        body = {"model": "m", "messages": messages, "stream": stream}
        return self.calls.post(
            "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}
        )

    def turn(self, key: str, messages: list[dict[str, Any]], *, stream: bool = False) -> str:
        """One call; appends the reply to ``messages`` as a harness would."""
        reply = self.chat(key, messages, stream=stream)
        assert reply.status_code == 200, reply.text
        if stream:
            text = "".join(
                chunk["choices"][0]["delta"].get("content") or ""
                for line in reply.text.splitlines()
                if line.startswith("data: {")
                for chunk in [httpx.Response(200, content=line[6:]).json()]
                if chunk["choices"]
            )
        else:
            text = reply.json()["choices"][0]["message"]["content"]
        messages.append({"role": "assistant", "content": text})
        return text

    def records(self, session_id: str) -> list[CompletionRecord]:
        return SqliteStore(self.db).records(session_id)

    def health(self) -> dict[str, Any]:
        return dict(httpx.get(f"{self.url}/health", timeout=30).json())


def _ids(worker: int, count: int, prefix: str) -> list[str]:
    """Session ids owned by ``worker`` in a group of two."""
    found = [f"{prefix}-{i}" for i in range(200) if owner_of(f"{prefix}-{i}", 2) == worker]
    return found[:count]


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any) -> Iterator[Group]:
    root = tmp_path_factory.mktemp("workers")
    script = script_from_dict(
        {
            "sessions": [
                {"session": "^slow", "cycle": True, "turns": [{"text": SLOW_TEXT}]},
                {"session": ".", "cycle": True, "turns": [{"text": "Done, next?"}]},
            ]
        }
    )
    engine = ScriptedEngine(script, tokenizer, token_delay_s=0.02).start()
    port = free_port()
    db = root / "records.db"
    command = [
        sys.executable, "-m", "polar", "gateway", "--workers", "2",
        "--port", str(port), "--admin-token", ADMIN,
        "--engine-kind", "vllm", "--engine-url", engine.url, "--engine-model", "scripted",
        "--capture", "token_in_token_out", "--store", str(db), "--log-level", "warning",
    ]  # fmt: skip
    log = (root / "gateway.log").open("wb")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, (root / "gateway.log").read_text()
            assert time.monotonic() < deadline, "the group did not start"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            time.sleep(0.2)
        running = Group(url, db, engine)
        yield running
        running.admin.close()
        running.calls.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
            log.close()
            engine.stop()
    assert proc.returncode == 0, (root / "gateway.log").read_text()


def test_every_call_of_a_session_is_spliced_on_the_worker_that_owns_it(group: Group) -> None:
    named = _ids(0, 2, "a") + _ids(1, 2, "a")
    sessions = [group.new_session(sid) for sid in named] + [group.new_session()]
    health = group.health()
    assert health["status"] == "ok" and [w["worker"] for w in health["workers"]] == [0, 1]
    status = group.admin.get("/admin/status").json()
    owned = [w["open_sessions"] for w in status["workers"]]
    assert sum(owned) == status["open_sessions"] == 5 and min(owned) >= 2
    listed = {s["session_id"] for s in group.admin.get("/admin/sessions").json()["sessions"]}
    assert listed == {sid for sid, _ in sessions}

    # Turns interleaved across sessions on one client connection, streamed and not.
    conversations = {sid: [{"role": "user", "content": f"task {sid}"}] for sid, _ in sessions}
    for turn in range(3):
        for n, (sid, key) in enumerate(sessions):
            assert group.turn(key, conversations[sid], stream=(turn + n) % 2 == 1)
            conversations[sid].append({"role": "user", "content": f"go on ({turn})"})

    for sid, _ in sessions:
        records = group.records(sid)
        assert [(r.seq, r.attempt, r.status) for r in records] == [
            (1, 1, RecordStatus.COMPLETED),
            (2, 1, RecordStatus.COMPLETED),
            (3, 1, RecordStatus.COMPLETED),
        ]
        for earlier, later in itertools.pairwise(records):
            lineage = later.lineage
            assert lineage is not None
            assert (lineage.origin, lineage.spliced, lineage.base_seq) == (
                PromptOrigin.EXTENDS,
                True,
                earlier.seq,
            ), sid
            head = earlier.prompt_ids + earlier.output_ids
            assert later.prompt_ids[: len(head)] == head
        # Readers through the router see the same records, whichever worker wrote them.
        got = group.admin.get(f"/admin/sessions/{sid}/records").json()["records"]
        assert [r["seq"] for r in got] == [1, 2, 3]
        assert group.admin.get(f"/admin/sessions/{sid}").json()["calls"] == 3
    group.engine.assert_clean(finished=False)


def test_keys_closes_pause_and_the_policy_version_hold_across_workers(group: Group) -> None:
    unknown = AuthenticationFailed("unknown or closed session key")
    forged = group.chat("sk-polar-forged", [{"role": "user", "content": "hi"}])
    assert (forged.status_code, forged.json()) == (401, openai_error(unknown))
    missing = group.calls.post("/v1/chat/completions", json={"model": "m", "messages": []})
    assert missing.status_code == 401 and "missing API key" in missing.json()["error"]["message"]
    anthropic = group.calls.post(
        "/v1/messages",
        json={"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-api-key": "sk-polar-forged", "anthropic-version": "2023-06-01"},
    )
    assert (anthropic.status_code, anthropic.json()) == (401, anthropic_error(unknown))
    gemini = group.calls.post(
        "/v1beta/models/m:generateContent?key=sk-polar-forged",
        json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
    )
    assert (gemini.status_code, gemini.json()) == (401, gemini_error(unknown))
    # A Gemini key in the query or its own header reaches the worker that owns the session.
    for sid in _ids(1, 2, "g"):
        _, key = group.new_session(sid)
        contents = [{"role": "user", "parts": [{"text": "hi"}]}]
        by_query = group.calls.post(
            f"/v1beta/models/m:generateContent?key={key}", json={"contents": contents}
        )
        assert by_query.status_code == 200, by_query.text
        by_header = group.calls.post(
            "/v1beta/models/m:streamGenerateContent?alt=sse",
            json={"contents": contents},
            headers={"x-goog-api-key": key},
        )
        assert by_header.status_code == 200 and "finishReason" in by_header.text
        assert [r.status for r in group.records(sid)] == [RecordStatus.COMPLETED] * 2

    # Close a session on each worker: its key stops working, its neighbours' do not.
    (keep0, close0), (keep1, close1) = _ids(0, 2, "b"), _ids(1, 2, "b")
    keys = {sid: group.new_session(sid)[1] for sid in (keep0, close0, keep1, close1)}
    for sid in (close0, close1):
        assert group.turn(keys[sid], [{"role": "user", "content": "one"}])
        assert group.admin.delete(f"/admin/sessions/{sid}").status_code == 204
        closed = group.chat(keys[sid], [{"role": "user", "content": "two"}])
        assert (closed.status_code, closed.json()) == (401, openai_error(unknown))
        again = group.admin.delete(f"/admin/sessions/{sid}")
        assert again.status_code == 404 and again.json()["error"]["type"] == "not_found_error"
        assert group.admin.get(f"/admin/sessions/{sid}").json()["calls"] == 1
        assert group.admin.get(f"/admin/sessions/{sid}").json()["closed_at"] is not None

    # Pause: every worker drains and holds its calls; resume stamps one version on all.
    paused = group.admin.post("/admin/pause", json={})
    assert paused.status_code == 200 and paused.json()["drained"] is True
    assert [w["paused"] for w in paused.json()["workers"]] == [True, True]
    results: dict[str, str] = {}

    def call(sid: str) -> None:
        results[sid] = group.turn(keys[sid], [{"role": "user", "content": "after pause"}])

    waiting = [threading.Thread(target=call, args=(sid,)) for sid in (keep0, keep1)]
    for thread in waiting:
        thread.start()
    deadline = time.monotonic() + 30
    while group.admin.get("/admin/status").json()["waiting"] < 2:
        assert time.monotonic() < deadline, "calls did not wait at the paused gate"
        time.sleep(0.05)
    status = group.admin.get("/admin/status").json()
    assert [w["waiting"] for w in status["workers"]] == [1, 1] and not results
    resumed = group.admin.post("/admin/resume", json={"policy_version": 7})
    assert resumed.status_code == 200
    assert (resumed.json()["paused"], resumed.json()["policy_version"]) == (False, 7)
    for thread in waiting:
        thread.join(30)
    assert set(results) == {keep0, keep1}
    for sid in (keep0, keep1):
        (record,) = group.records(sid)
        assert (record.seq, record.policy_version) == (1, 7)
    bad = group.admin.post("/admin/resume", json={"policy_version": -1})
    assert bad.status_code == 400
    wrong = httpx.post(f"{group.url}/admin/pause", json={}, headers={"authorization": "Bearer x"})
    assert wrong.status_code == 401
    assert group.admin.get("/admin/status").json()["paused"] is False


def _raw(url: str, request: bytes) -> bytes:
    """Send raw bytes to the group; everything it answers until it closes."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(request)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


def test_the_router_refuses_ambiguous_framing_and_passes_chunked_bodies(group: Group) -> None:
    smuggle = _raw(
        group.url,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /admin/status HTTP/1.1\r\n\r\n",
    )
    assert smuggle.startswith(b"HTTP/1.1 400") and smuggle.count(b"HTTP/1.1") == 1
    sid, key = group.new_session(_ids(1, 1, "d")[0])
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "chunked"}]})
    half = len(body) // 2
    chunks = b"".join(
        f"{len(part):x}\r\n".encode() + part.encode() + b"\r\n"
        for part in (body[:half], body[half:])
    )
    reply = _raw(
        group.url,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        + f"Authorization: Bearer {key}\r\n".encode()
        + b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        + chunks
        + b"0\r\n\r\n",
    )
    assert reply.startswith(b"HTTP/1.1 200"), reply[:300]
    assert json.loads(reply.partition(b"\r\n\r\n")[2])["choices"][0]["message"]["content"]
    (record,) = group.records(sid)
    assert record.status is RecordStatus.COMPLETED


def test_repeated_credentials_an_admin_key_in_x_api_key_and_big_heads_are_refused(
    group: Group,
) -> None:
    """As a lone gateway refuses them: a repeated credential header is a 400 in the
    dialect's shape (or the admin API's), the admin token only counts as a bearer,
    a head over the limit is a 431."""
    _, key = group.new_session(_ids(0, 1, "e")[0])
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    for path in ("/v1/chat/completions", "/v1/messages"):
        reply = httpx.post(
            f"{group.url}{path}",
            headers=[("authorization", f"Bearer {key}"), ("authorization", "Bearer other")],
            json=body,
        )
        assert reply.status_code == 400, reply.text
        assert "more than one 'authorization' header" in reply.json()["error"]["message"]
    twice = [("authorization", f"Bearer {ADMIN}")] * 2
    assert httpx.get(f"{group.url}/admin/status", headers=twice).status_code == 400
    in_x_api_key = httpx.get(f"{group.url}/admin/status", headers={"x-api-key": ADMIN})
    assert in_x_api_key.status_code == 401, in_x_api_key.text
    big = {"authorization": f"Bearer {key}", "x-padding": "p" * (200 << 10)}
    reply = httpx.post(f"{group.url}/v1/chat/completions", headers=big, json=body)
    assert reply.status_code == 431, reply.text[:300]
    assert group.chat(key, [{"role": "user", "content": "still served"}]).status_code == 200


def test_a_dead_worker_is_restarted_and_does_not_stop_the_other(group: Group) -> None:
    (alive,) = _ids(0, 1, "c")
    (victim,) = _ids(1, 1, "c")
    (slow,) = _ids(1, 1, "slow")
    keys = {sid: group.new_session(sid)[1] for sid in (alive, victim, slow)}
    victim_chat = [{"role": "user", "content": "start"}]
    assert group.turn(keys[victim], victim_chat)
    victim_chat.append({"role": "user", "content": "more"})

    # A streamed call in flight on worker 1 when it is killed.
    outcome: dict[str, Any] = {}

    def slow_call() -> None:
        with httpx.Client(base_url=group.url, timeout=60) as client:
            try:
                reply = client.post(
                    "/v1/chat/completions",
                    json={
                        "model": "m",
                        "stream": True,
                        "messages": [{"role": "user", "content": "x"}],
                    },
                    headers={"authorization": f"Bearer {keys[slow]}"},
                )
                outcome["status"] = reply.status_code
            except httpx.HTTPError as exc:
                outcome["error"] = type(exc).__name__

    thread = threading.Thread(target=slow_call)
    thread.start()
    deadline = time.monotonic() + 30
    while not any(r.status is RecordStatus.IN_FLIGHT for r in group.records(slow)):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    pid = group.health()["workers"][1]["pid"]
    os.kill(pid, signal.SIGKILL)
    thread.join(30)
    assert outcome, "the client of the killed worker's call was left hanging"

    # Worker 0 goes on serving while worker 1 is down or restarting.
    assert group.turn(keys[alive], [{"role": "user", "content": "still there?"}])
    down = group.chat(keys[victim], victim_chat)
    if down.status_code != 200:  # still restarting: a 503 in the dialect's shape
        assert down.status_code == 503
        assert down.json()["error"]["code"] == "worker_unavailable"
    deadline = time.monotonic() + 240
    while True:
        health = group.health()
        if health["status"] == "ok" and health["workers"][1]["pid"] != pid:
            break
        assert time.monotonic() < deadline, health
        time.sleep(0.2)
    (interrupted,) = group.records(slow)
    assert interrupted.status is RecordStatus.INTERRUPTED
    # The victim's session goes on: same key, the next sequence number; its
    # transcript died with the worker, so this call is rendered afresh.
    reply = group.chat(keys[victim], victim_chat)
    assert reply.status_code == 200, reply.text
    records = [r for r in group.records(victim) if r.status is RecordStatus.COMPLETED]
    assert records[0].seq == 1 and records[-1].seq == max(r.seq for r in group.records(victim))
    lineage = records[-1].lineage
    assert lineage is not None and not lineage.spliced
