"""Hostile request bodies: each gets a 400/413 in the dialect's shape and changes nothing.

Deep nesting is the family that used to kill the gateway (a 1,000-deep value in
an unknown field made logging the failed record recurse, the store's writer
thread died and every later call hung). Now the body's structure is checked
right after decoding, before anything else reads it.
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from polar.ir import Dialect, RecordStatus

from support.faulty import PATHS, assert_dialect_error, client_headers, request_body

CAPTURES = ["engine_rendered", "token_in_token_out"]


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def raw_body(dialect: Dialect, unknown: bytes, *, stream: bool = False) -> bytes:
    base = orjson.dumps(request_body(dialect, stream=stream))
    return base[:-1] + b', "x_extra": ' + unknown + b"}"


@pytest.mark.parametrize("capture", CAPTURES)
def test_deep_nesting_is_a_400_in_every_dialect_and_the_gateway_lives_on(
    make_stack: Any, capture: str
) -> None:
    stack = make_stack({"turns": [{"text": "ok"}], "cycle": True}, capture=capture)
    sid, key = stack.new_session()
    with httpx.Client(base_url=stack.url, headers=client_headers(key), timeout=30) as client:
        for dialect in PATHS:
            # 1,000 deep (orjson's own limit is 1,024), 300 (orjson writes 255), 65.
            for depth in (1000, 300, 65):
                for stream in (False, True) if depth == 1000 else (False,):
                    reply = client.post(
                        PATHS[dialect], content=raw_body(dialect, nested(depth), stream=stream)
                    )
                    message = assert_dialect_error(dialect, reply, 400)
                    assert "nested deeper than 64 levels" in message
                    assert "x_extra" in message
        assert stack.engine.requests == [], "nothing reached the engine"
        assert client.get("/health").status_code == 200
        # Still serving, and a body nested just inside the limit is served and recorded.
        for dialect in PATHS:
            reply = client.post(PATHS[dialect], content=raw_body(dialect, nested(60)))
            assert reply.status_code == 200, reply.text
    records = stack.records(sid)
    assert [r.status for r in records] == [RecordStatus.COMPLETED] * 3
    assert all(r.original_request["x_extra"] is not None for r in records)


@pytest.mark.parametrize("capture", CAPTURES)
def test_deep_tool_schemas_and_empty_conversations_never_reach_the_template(
    make_stack: Any, capture: str
) -> None:
    """Token-in/token-out mode: a 500-deep tool schema used to be a template
    ``RecursionError`` (500), and the fuzz test once found a Responses request
    with no input reaching the template (500 ``Cannot apply chat template to an
    empty conversation``). Engine-rendered mode sent that empty conversation to
    the engine, whose template refused it: a 502 (2 of 10,000 fuzzed Responses
    requests). All are 400s now, in every dialect and both modes."""
    stack = make_stack({"turns": [{"text": "ok"}]}, capture=capture)
    _, key = stack.new_session()
    # Built as bytes: json.dumps itself would recurse that deep.
    schema = b'{"type": "object", "properties": {"a": ' * 500 + b'{"type": "string"}' + b"}}" * 500
    bodies = {
        Dialect.OPENAI_RESPONSES: b'{"model": "m", "input": "hi", "stream": true, "tools": '
        b'[{"type": "function", "name": "t", "parameters": ' + schema + b"}]}",
        Dialect.OPENAI_CHAT: b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], '
        b'"tools": [{"type": "function", "function": {"name": "t", "parameters": '
        + schema
        + b"}}]}",
    }
    with httpx.Client(base_url=stack.url, headers=client_headers(key), timeout=30) as client:
        for dialect, raw in bodies.items():
            message = assert_dialect_error(dialect, client.post(PATHS[dialect], content=raw), 400)
            assert "nested deeper" in message
        for dialect in PATHS:
            body = request_body(dialect, stream=True)
            body["input" if dialect is Dialect.OPENAI_RESPONSES else "messages"] = []
            assert_dialect_error(dialect, client.post(PATHS[dialect], json=body), 400)
        # Responses accepts an empty input list; the gateway then refuses it itself.
        body = request_body(Dialect.OPENAI_RESPONSES, stream=False, input=[])
        reply = client.post(PATHS[Dialect.OPENAI_RESPONSES], json=body)
        assert "no messages" in assert_dialect_error(Dialect.OPENAI_RESPONSES, reply, 400)
    assert stack.engine.requests == []


@pytest.mark.parametrize("dialect", list(PATHS), ids=lambda d: d.value)
def test_oversized_parts_get_clear_errors(make_stack: Any, dialect: Dialect) -> None:
    stack = make_stack(
        {"turns": [{"text": "never"}]},
        limits={
            "max_body_bytes": 1 << 20,
            "max_string_chars": 4096,
            "max_array_items": 100,
            "max_messages": 20,
            "max_tools": 2,
        },
    )
    sid, key = stack.new_session()
    field = "input" if dialect is Dialect.OPENAI_RESPONSES else "messages"
    message = {"role": "user", "content": "hi"}
    tool = (
        {"type": "function", "name": "t", "parameters": {"type": "object"}}
        if dialect is Dialect.OPENAI_RESPONSES
        else {"name": "t", "input_schema": {"type": "object"}}
        if dialect is Dialect.ANTHROPIC_MESSAGES
        else {"type": "function", "function": {"name": "t", "parameters": {"type": "object"}}}
    )
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({field: [{"role": "user", "content": "y" * 5000}]}, 400, "max_string_chars"),
        ({field: [message] * 21}, 400, "max_messages"),
        ({"tools": [tool] * 3}, 400, "max_tools"),
        ({"x_list": list(range(101))}, 400, "max_array_items"),
        ({"x_big": ["z" * 4000] * 90 * 3}, 413, "exceeds the limit"),
    ]
    with httpx.Client(base_url=stack.url, headers=client_headers(key), timeout=30) as client:
        for extra, status, needle in cases:
            reply = client.post(
                PATHS[dialect], json={**request_body(dialect, stream=False), **extra}
            )
            if status == 413:
                assert reply.status_code == 413, reply.text[:300]
                continue
            assert needle in assert_dialect_error(dialect, reply, status)
    assert stack.engine.requests == []
    assert stack.records(sid) == []


def test_session_ids_must_match_whole(make_stack: Any) -> None:
    stack = make_stack({"turns": [{"text": "never"}]})
    with stack.admin() as admin:
        for bad in ("evil\n", "a b", "", "x" * 200, 42):
            reply = admin.post("/admin/sessions", json={"session_id": bad})
            assert reply.status_code == 400, (bad, reply.text)
        assert admin.post("/admin/sessions", json={"session_id": "good-1.a_b"}).status_code == 201


def test_unknown_field_names_are_bounded(make_stack: Any) -> None:
    stack = make_stack({"turns": [{"text": "never"}]})
    gateway = stack.gateway
    gateway.note_unknown_fields(Dialect.OPENAI_CHAT, (f"f{i}" + "n" * 4000 for i in range(5000)))
    known = gateway._unknown_fields
    assert len(known) <= 256
    assert all(len(name) <= 64 for _, name in known)


@pytest.mark.parametrize("capture", CAPTURES)
def test_chat_template_kwargs_cannot_replace_the_template(make_stack: Any, capture: str) -> None:
    """A ``chat_template`` kwarg used to reach ``apply_chat_template`` in
    token-in/token-out mode: the client's template was rendered in place of
    the model's, and this one (10^10 loop steps in the sandbox) held the event
    loop for hours. ``tokenize`` and ``tools`` were 500s. All are 400s now, in
    both modes, and nothing reaches the engine."""
    stack = make_stack({"turns": [{"text": "ok"}]}, capture=capture)
    sid, key = stack.new_session()
    forever = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
    with httpx.Client(base_url=stack.url, headers=client_headers(key), timeout=30) as client:
        for kwargs in ({"chat_template": forever}, {"tokenize": True}, {"tools": [1], "x": 1}):
            for stream in (False, True):
                body = request_body(Dialect.OPENAI_CHAT, stream=stream, chat_template_kwargs=kwargs)
                reply = client.post(PATHS[Dialect.OPENAI_CHAT], json=body)
                message = assert_dialect_error(Dialect.OPENAI_CHAT, reply, 400)
                assert f"chat_template_kwargs may not set {min(kwargs)}" in message
        assert stack.engine.requests == []
        body = request_body(
            Dialect.OPENAI_CHAT, stream=False, chat_template_kwargs={"enable_thinking": False}
        )
        assert client.post(PATHS[Dialect.OPENAI_CHAT], json=body).status_code == 200
    assert [r.status for r in stack.records(sid)] == [RecordStatus.COMPLETED]
