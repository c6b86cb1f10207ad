"""Bad input, bad keys, failing engines and vanishing clients.

Each case checks three things: the client gets an error in OpenAI's shape with
a sensible status, the engine is (or is not) called, and the record store holds
exactly what happened.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from polar.ir import ErrorKind, RecordStatus
from polar.proxy.engines.vllm_process import free_port

from support.stack import BASH_TOOL

USER = [{"role": "user", "content": "hi"}]


def assert_openai_error(reply: httpx.Response, status: int, needle: str) -> dict[str, Any]:
    assert reply.status_code == status, reply.text
    body = reply.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert needle in body["error"]["message"]
    return body["error"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("headers", "needle"),
    [
        ({}, "missing API key"),
        ({"authorization": "Bearer sk-polar-not-a-real-key"}, "unknown or closed session key"),
        ({"x-api-key": "sk-polar-not-a-real-key"}, "unknown or closed session key"),
        ({"authorization": "Basic abc"}, "missing API key"),
    ],
)
def test_unknown_or_missing_key_is_refused_and_not_forwarded(
    make_stack: Any, headers: dict[str, str], needle: str
) -> None:
    stack = make_stack({"turns": [{"text": "never"}]})
    reply = httpx.post(
        f"{stack.url}/v1/chat/completions",
        headers=headers,
        json={"model": "m", "messages": USER},
    )
    error = assert_openai_error(reply, 401, needle)
    assert error["code"] == "invalid_api_key"
    assert stack.engine.requests == []


def test_closed_session_key_stops_working(make_stack: Any) -> None:
    stack = make_stack({"turns": [{"text": "one"}]})
    sid, key = stack.new_session()
    with stack.client(key) as client:
        assert client.post("/v1/chat/completions", json={"model": "m", "messages": USER}).is_success
        with stack.admin() as admin:
            assert admin.delete(f"/admin/sessions/{sid}").status_code == 204
        reply = client.post("/v1/chat/completions", json={"model": "m", "messages": USER})
    assert_openai_error(reply, 401, "unknown or closed")
    assert len(stack.records(sid)) == 1


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "must be a JSON object"),
        (b"", 400, "body is empty"),
        (b'{"model": "m"}', 400, "messages: field required"),
        (b'{"model": "m", "messages": "hi"}', 400, "messages"),
        (b'{"model": "m", "messages": []}', 400, "messages"),
        (b'{"model": "m", "messages": [{"role": "robot", "content": "x"}]}', 400, "role"),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 2}',
            400,
            "n must be 1",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}',
            400,
            "temperature",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}',
            400,
            "'input_audio'",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], '
            b'"tools": [{"type": "web_search"}]}',
            400,
            "'web_search'",
        ),
        (
            b'{"model": "m", "messages": [{"role": "tool", "content": "x"}]}',
            400,
            "tool_call_id",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}',
            400,
            "needs logprobs",
        ),
    ],
)
def test_bad_requests_get_400_and_change_nothing(
    make_stack: Any, body: bytes, status: int, needle: str
) -> None:
    stack = make_stack({"turns": [{"text": "never"}]})
    sid, key = stack.new_session()
    with stack.client(key) as client:
        reply = client.post(
            "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
        )
    assert_openai_error(reply, status, needle)
    assert stack.engine.requests == []
    assert stack.records(sid) == []


def test_oversized_body_gets_413(make_stack: Any) -> None:
    stack = make_stack({"turns": [{"text": "never"}]}, limits={"max_body_bytes": 4096})
    sid, key = stack.new_session()
    with stack.client(key) as client:
        reply = client.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "x" * 10_000}]},
        )
    assert_openai_error(reply, 413, "exceeds the limit")
    assert stack.records(sid) == []


def test_engine_4xx_passes_through_with_its_message_and_is_recorded(make_stack: Any) -> None:
    stack = make_stack({"turns": [{"text": "never"}]}, engine={"model": "not-served"})
    sid, key = stack.new_session()
    with stack.client(key) as client:
        reply = client.post("/v1/chat/completions", json={"model": "m", "messages": USER})
    error = assert_openai_error(reply, 404, "does not exist")
    assert error["type"] == "invalid_request_error"
    (record,) = stack.records(sid)
    assert record.status is RecordStatus.FAILED
    assert record.error is not None and record.error.kind is ErrorKind.ENGINE_HTTP
    assert record.attempt == 1


def test_engine_5xx_becomes_502_and_script_mismatch_is_loud(make_stack: Any) -> None:
    stack = make_stack({"turns": [{"text": "x", "expect": {"last_text_contains": "magic word"}}]})
    sid, key = stack.new_session()
    with stack.client(key) as client:
        reply = client.post("/v1/chat/completions", json={"model": "m", "messages": USER})
    assert_openai_error(reply, 502, "does not match the script")
    assert len(stack.engine.failures) == 1
    (record,) = stack.records(sid)
    assert record.status is RecordStatus.FAILED


@pytest.mark.parametrize("stream", [False, True])
def test_unreachable_engine_is_retried_then_502_every_attempt_recorded(
    make_stack: Any, stream: bool
) -> None:
    stack = make_stack(
        {"turns": [{"text": "never"}]},
        engine_url=f"http://127.0.0.1:{free_port()}",
        engine={"max_attempts": 3},
    )
    sid, key = stack.new_session()
    with stack.client(key) as client:
        reply = client.post(
            "/v1/chat/completions", json={"model": "m", "messages": USER, "stream": stream}
        )
    error = assert_openai_error(reply, 502, "connection failed")
    assert error["type"] == "server_error"
    records = stack.records(sid)
    assert [(r.seq, r.attempt) for r in records] == [(1, 1), (1, 2), (1, 3)]
    assert all(r.status is RecordStatus.FAILED for r in records)
    assert all(r.error and r.error.kind is ErrorKind.ENGINE_UNAVAILABLE for r in records)


def test_engine_timeout_becomes_504(make_stack: Any) -> None:
    stack = make_stack(
        {"turns": [{"text": "slow"}]}, token_delay_s=1.0, engine={"read_timeout_s": 0.2}
    )
    sid, key = stack.new_session()
    with stack.client(key) as client:
        reply = client.post(
            "/v1/chat/completions", json={"model": "m", "messages": USER, "stream": True}
        )
    assert_openai_error(reply, 504, "timed out")
    (record,) = stack.records(sid)
    assert record.error is not None and record.error.kind is ErrorKind.ENGINE_TIMEOUT


def test_engine_failure_mid_stream_is_an_sse_error_event(make_stack: Any) -> None:
    stack = make_stack({"turns": [{"text": " ".join(["word"] * 30), "crash_after": 10}]})
    sid, key = stack.new_session()
    with (
        stack.client(key) as client,
        client.stream(
            "POST", "/v1/chat/completions", json={"model": "m", "messages": USER, "stream": True}
        ) as response,
    ):
        assert response.status_code == 200
        lines = list(response.iter_lines())
    events = [line for line in lines if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert '"error"' in events[-2]
    (record,) = stack.records(sid)
    assert record.status is RecordStatus.FAILED
    assert len(record.output_ids) == 10, "partial output is kept on the record"
    assert record.error is not None and record.error.kind is ErrorKind.ENGINE_UNAVAILABLE


def test_client_disconnect_mid_stream_records_the_call_as_aborted(make_stack: Any) -> None:
    stack = make_stack({"turns": [{"text": " ".join(["token"] * 60)}]}, token_delay_s=0.03)
    sid, key = stack.new_session()
    with (
        stack.client(key) as client,
        client.stream(
            "POST", "/v1/chat/completions", json={"model": "m", "messages": USER, "stream": True}
        ) as response,
    ):
        lines = response.iter_lines()
        for _ in range(8):
            next(lines)
    # The client closed the connection; the gateway notices and records the call
    # (its row was written in flight when the engine was called).
    deadline = time.monotonic() + 10
    records: list[Any] = []
    while time.monotonic() < deadline and (
        not records or records[0].status is RecordStatus.IN_FLIGHT
    ):
        records = stack.records(sid)
        time.sleep(0.05)
    (record,) = records
    assert record.status is RecordStatus.ABORTED
    assert record.error is not None and record.error.kind is ErrorKind.CLIENT_DISCONNECTED
    assert 0 < len(record.output_ids) < 60
    assert len(record.output_logprobs) == len(record.output_ids)


def test_unknown_routes_get_a_json_404(make_stack: Any) -> None:
    stack = make_stack({"turns": []})
    reply = httpx.post(f"{stack.url}/v1/nothing-here", json={})
    assert reply.status_code == 404
    assert "error" in reply.json()


def test_tool_choice_must_name_an_offered_tool(make_stack: Any) -> None:
    stack = make_stack({"turns": []})
    _, key = stack.new_session()
    with stack.client(key) as client:
        reply = client.post(
            "/v1/chat/completions",
            json={
                "model": "m",
                "messages": USER,
                "tools": [BASH_TOOL],
                "tool_choice": {"type": "function", "function": {"name": "python"}},
            },
        )
    assert_openai_error(reply, 400, "'python'")
