"""The gateway and its record store: health, fail-fast and what a restart keeps."""

from __future__ import annotations

import time
from typing import Any

import httpx

from polar.ir import Dialect, RecordStatus

from support.faulty import PATHS, assert_dialect_error, client_headers, request_body


def test_a_store_that_cannot_write_makes_health_503_and_calls_fail_fast(make_stack: Any) -> None:
    """The disk is "filled" with SQLite's ``max_page_count`` on the writer's own
    connection: the writer gets ``database or disk is full``, as on a full disk.
    The engine's context is set past the big prompt's length, so the output
    limit (:mod:`polar.proxy.call.maxtokens`) lets it through to the store."""
    stack = make_stack(
        {"turns": [{"text": "ok"}], "cycle": True}, engine={"max_model_len": 1_000_000}
    )
    sid, key = stack.new_session()
    conn = stack.gateway.store._writer._conn
    with httpx.Client(base_url=stack.url, headers=client_headers(key), timeout=30) as client:
        assert client.get("/health").json()["store"]["writing"] is True
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages}")
        big = "".join(f"{i:x}" for i in range(60_000))  # ~250 KB, poorly compressible
        for dialect in PATHS:
            body = request_body(dialect, stream=True)
            body["messages" if dialect is not Dialect.OPENAI_RESPONSES else "input"] = [
                {"role": "user", "content": big}
            ]
            started = time.monotonic()
            reply = client.post(PATHS[dialect], json=body)
            assert time.monotonic() - started < 10, "fails fast, never hangs"
            assert "cannot record calls" in assert_dialect_error(dialect, reply, 503)
        health = client.get("/health")
        assert health.status_code == 503
        assert health.json()["status"] == "degraded"
        assert "full" in health.json()["store"]["last_error"]
        assert stack.engine.requests == [], "nothing unrecorded reached the engine"
        # Space again: the next call is served and recorded, health is back.
        conn.execute("PRAGMA max_page_count = 1073741823")
        reply = client.post(
            PATHS[Dialect.OPENAI_CHAT], json=request_body(Dialect.OPENAI_CHAT, stream=False)
        )
        assert reply.status_code == 200, reply.text
        assert client.get("/health").status_code == 200
    assert [r.status for r in stack.records(sid)] == [RecordStatus.COMPLETED]


def test_a_call_is_in_the_store_while_in_flight_and_the_version_survives_a_restart(
    make_stack: Any,
) -> None:
    stack = make_stack(
        {"turns": [{"text": " ".join(["w"] * 40)}], "cycle": True}, token_delay_s=0.05
    )
    sid, key = stack.new_session()
    with stack.admin() as admin:
        assert admin.post("/admin/pause", json={}).status_code == 200
        assert admin.post("/admin/resume", json={"policy_version": 7}).status_code == 200
    with (
        httpx.Client(base_url=stack.url, headers=client_headers(key), timeout=30) as client,
        client.stream(
            "POST", PATHS[Dialect.OPENAI_CHAT], json=request_body(Dialect.OPENAI_CHAT, stream=True)
        ) as reply,
    ):
        lines = reply.iter_lines()
        next(lines)
        (running,) = stack.records(sid)
        assert running.status is RecordStatus.IN_FLIGHT and running.policy_version == 7
        list(lines)
    (done,) = stack.records(sid)
    assert done.status is RecordStatus.COMPLETED and len(done.output_ids) > 10
    stack.stop_gateway()
    stack.start_gateway()
    with httpx.Client(base_url=stack.url, headers=client_headers(key), timeout=30) as client:
        reply = client.post(
            PATHS[Dialect.OPENAI_CHAT], json=request_body(Dialect.OPENAI_CHAT, stream=False)
        )
        assert reply.status_code == 200, reply.text
    assert [r.policy_version for r in stack.records(sid)] == [7, 7]
