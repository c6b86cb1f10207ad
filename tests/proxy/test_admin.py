"""Admin API: sessions, records, durability, restart, and the weight-sync gate."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from typing import Any

import httpx
import pytest

from polar.ir import RecordStatus

USER = [{"role": "user", "content": "hi"}]


def test_admin_endpoints_need_the_admin_token(make_stack: Any) -> None:
    stack = make_stack({"turns": []})
    for headers in ({}, {"authorization": "Bearer wrong-token-wrong-token"}):
        reply = httpx.post(f"{stack.url}/admin/sessions", headers=headers, json={})
        assert reply.status_code == 401
        assert reply.json()["error"]["type"] == "authentication_error"
    _, key = stack.new_session()
    reply = httpx.get(f"{stack.url}/admin/status", headers={"authorization": f"Bearer {key}"})
    assert reply.status_code == 401, "a session key is not an admin token"


def test_create_session_validates_its_input(make_stack: Any) -> None:
    stack = make_stack({"turns": []})
    with stack.admin() as admin:
        assert admin.post("/admin/sessions", json={"session_id": "bad id!"}).status_code == 400
        assert admin.post("/admin/sessions", json={"colour": "red"}).status_code == 400
        assert admin.post("/admin/sessions", json={"metadata": [1]}).status_code == 400
        ok = admin.post("/admin/sessions", json={"session_id": "task-1.sample-0"})
        assert ok.status_code == 201
        assert ok.json()["api_key"].startswith("sk-polar-")
        dup = admin.post("/admin/sessions", json={"session_id": "task-1.sample-0"})
        assert dup.status_code == 400
        assert "already exists" in dup.json()["error"]["message"]
        assert admin.get("/admin/sessions/nope").status_code == 404
        assert admin.delete("/admin/sessions/nope").status_code == 404


def test_records_api_returns_every_call_as_json_and_jsonl(make_stack: Any) -> None:
    stack = make_stack({"turns": [{"text": "a"}, {"text": "b"}]})
    sid, key = stack.new_session(task="t1")
    client = stack.openai(key)
    client.chat.completions.create(model="m", messages=USER)
    list(client.chat.completions.create(model="m", messages=USER, stream=True))
    with stack.admin() as admin:
        as_json = admin.get(f"/admin/sessions/{sid}/records").json()["records"]
        as_jsonl = admin.get(f"/admin/sessions/{sid}/records", params={"format": "jsonl"}).text
        info = admin.get(f"/admin/sessions/{sid}").json()
        assert (
            admin.get(f"/admin/sessions/{sid}/records", params={"format": "xml"}).status_code == 400
        )
    rows = [json.loads(line) for line in as_jsonl.splitlines()]
    assert [r["seq"] for r in rows] == [r["seq"] for r in as_json] == [1, 2]
    assert rows[0]["stream"] is False and rows[1]["stream"] is True
    assert len(rows[0]["output_ids"]) == len(rows[0]["output_logprobs"]) > 0
    assert info["metadata"] == {"task": "t1"} and info["calls"] >= 1


def test_record_is_committed_before_the_final_byte(make_stack: Any) -> None:
    stack = make_stack({"turns": [{"text": "durable reply"}]})
    sid, key = stack.new_session()
    with (
        stack.client(key) as client,
        client.stream(
            "POST", "/v1/chat/completions", json={"model": "m", "messages": USER, "stream": True}
        ) as response,
    ):
        for line in response.iter_lines():
            if '"finish_reason":"stop"' in line:
                # The finishing chunk is out: the record must already be on disk.
                with sqlite3.connect(stack.db_path) as db:
                    rows = db.execute(
                        "SELECT status FROM records WHERE session_id = ?", (sid,)
                    ).fetchall()
                assert rows == [("completed",)]
                break
        else:
            pytest.fail("no finishing chunk")


def test_sessions_and_sequence_numbers_survive_a_restart(make_stack: Any) -> None:
    stack = make_stack({"turns": [{"text": "before"}, {"text": "after"}]})
    sid, key = stack.new_session()
    stack.openai(key).chat.completions.create(model="m", messages=USER)
    stack.stop_gateway()
    stack.start_gateway()
    stack.openai(key).chat.completions.create(model="m", messages=USER)
    assert [r.seq for r in stack.records(sid)] == [1, 2]


def test_storage_stats_report_bytes_per_session(make_stack: Any) -> None:
    stack = make_stack({"turns": [{"text": "x"}]})
    sid, key = stack.new_session()
    stack.openai(key).chat.completions.create(model="m", messages=USER)
    with stack.admin() as admin:
        stats = admin.get(f"/admin/sessions/{sid}/stats").json()
    assert stats["records"] == 1
    assert stats["stored_bytes"] > 0 and stats["naive_bytes"] > 0


# ---------------------------------------------------------------- weight-sync gate


def _call_in_thread(stack: Any, key: str, out: list[Any], **extra: Any) -> threading.Thread:
    def run() -> None:
        with stack.client(key) as client:
            out.append(
                client.post("/v1/chat/completions", json={"model": "m", "messages": USER, **extra})
            )

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_calls_wait_while_paused_and_run_under_the_new_policy_version(make_stack: Any) -> None:
    stack = make_stack({"turns": [{"text": "v0"}, {"text": "v7"}]})
    sid, key = stack.new_session()
    stack.openai(key).chat.completions.create(model="m", messages=USER)
    with stack.admin() as admin:
        paused = admin.post("/admin/pause", json={"timeout_s": 5})
        assert paused.status_code == 200 and paused.json()["drained"] is True
        out: list[Any] = []
        thread = _call_in_thread(stack, key, out)
        time.sleep(0.5)
        assert out == [], "a call must not run while the gateway is paused"
        status = admin.get("/admin/status").json()
        assert status["paused"] is True and status["waiting"] == 1
        resumed = admin.post("/admin/resume", json={"policy_version": 7})
        assert resumed.json() | {"paused": False, "policy_version": 7} == resumed.json()
        thread.join(10)
    assert out[0].status_code == 200
    assert [r.policy_version for r in stack.records(sid)] == [0, 7]


def test_a_restarted_gateway_keeps_its_policy_version(make_stack: Any) -> None:
    stack = make_stack({"turns": [{"text": "x"}]})
    with stack.admin() as admin:
        admin.post("/admin/pause", json={"timeout_s": 5})
        assert admin.post("/admin/resume", json={"policy_version": 9}).status_code == 200
    stack.stop_gateway()
    stack.start_gateway()
    with stack.admin() as admin:
        assert admin.get("/admin/status").json()["policy_version"] == 9


def test_pause_waits_for_in_flight_calls_to_drain(make_stack: Any) -> None:
    stack = make_stack({"turns": [{"text": " ".join(["slow"] * 20)}]}, token_delay_s=0.05)
    sid, key = stack.new_session()
    out: list[Any] = []
    thread = _call_in_thread(stack, key, out, stream=True)
    time.sleep(0.3)
    with stack.admin() as admin:
        reply = admin.post("/admin/pause", json={"timeout_s": 10})
        assert reply.status_code == 200
        assert reply.json()["drained"] is True and reply.json()["inflight"] == 0
        assert reply.json()["drained_calls"] == 1
        assert reply.json()["waited_s"] > 0.2
        admin.post("/admin/resume")
    thread.join(10)
    assert stack.records(sid)[0].status is RecordStatus.COMPLETED


def test_pause_times_out_with_504_and_stays_paused(make_stack: Any) -> None:
    stack = make_stack({"turns": [{"text": " ".join(["slow"] * 30)}]}, token_delay_s=0.05)
    _, key = stack.new_session()
    out: list[Any] = []
    thread = _call_in_thread(stack, key, out, stream=True)
    time.sleep(0.3)
    with stack.admin() as admin:
        reply = admin.post("/admin/pause", json={"timeout_s": 0.1})
        assert reply.status_code == 504
        assert reply.json()["drained"] is False and reply.json()["inflight"] == 1
        assert admin.get("/admin/status").json()["paused"] is True
        assert admin.post("/admin/pause", json={"timeout_s": -1}).status_code == 400
        admin.post("/admin/resume")
    thread.join(10)
    assert out[0].status_code == 200


def test_a_call_paused_too_long_gets_503(make_stack: Any) -> None:
    stack = make_stack({"turns": []}, limits={"pause_wait_s": 0.2})
    sid, key = stack.new_session()
    with stack.admin() as admin:
        admin.post("/admin/pause")
    with stack.client(key) as client:
        reply = client.post("/v1/chat/completions", json={"model": "m", "messages": USER})
    assert reply.status_code == 503
    assert reply.json()["error"]["code"] == "gateway_paused"
    assert stack.engine.requests == [] and stack.records(sid) == []


def test_admin_token_is_required_in_config() -> None:
    from pydantic import ValidationError

    from polar.proxy.config import GatewayConfig

    with pytest.raises(ValidationError):
        GatewayConfig.model_validate(
            {"admin_token": "short", "engine": {"base_url": "http://x", "model": "m"}}
        )
