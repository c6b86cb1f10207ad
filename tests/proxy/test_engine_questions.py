"""The engine requests the gateway makes besides the call itself, failing.

Engine-rendered capture with a known context length asks the engine's
``/tokenize`` before each call (the output limit needs the prompt's length),
and a gateway without ``engine.max_model_len`` asks ``GET /v1/models`` for
it. Here both fail, stall and reset; what must hold: every attempt that
reached the engine is recorded with its outcome, the client gets its
dialect's error shape with the right status, transient failures are retried
as calls are, and no other session's call waits on a stalled answer.

The engine is :class:`~support.faulty.FaultyEngine` (a real HTTP server that
answers each path as told: a real vLLM cannot be made to fail on purpose); the
gateway is the real one, over HTTP.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from email.message import Message
from typing import Any

import httpx
import orjson
import pytest

from polar.ir import Dialect, ErrorKind, RecordStatus

from support.faulty import (
    PATHS,
    FaultyEngine,
    Reply,
    assert_dialect_error,
    chat_reply,
    client_headers,
    request_body,
)

COUNT = Reply(body=b'{"count": 12}')
MODELS_WITH_LENGTH = Reply(body=b'{"data": [{"id": "scripted", "max_model_len": 4096}]}')


@pytest.fixture
def faulty() -> Iterator[FaultyEngine]:
    engine = FaultyEngine(reply=Reply(body=chat_reply([7, 8], [-0.5, -0.25])))
    yield engine
    for route in engine.routes.values():
        if isinstance(route, Reply) and route.hold is not None:
            route.hold.set()
    engine.stop()


def _call(stack: Any, key: str, dialect: Dialect = Dialect.OPENAI_CHAT, **body: Any) -> Any:
    with httpx.Client(base_url=stack.url, headers=client_headers(key), timeout=60) as client:
        return client.post(PATHS[dialect], json=request_body(dialect, **{"stream": False, **body}))


@pytest.mark.parametrize(
    ("fault", "status", "kind", "attempts"),
    [
        (Reply(status=500, body=b'{"error": {"message": "tokenizer fell over"}}'), 502,
         ErrorKind.ENGINE_HTTP, 1),
        (Reply(reset=True), 502, ErrorKind.ENGINE_UNAVAILABLE, 2),
        (Reply(body=b'{"count": 12}', delay_s=2.0), 504, ErrorKind.ENGINE_TIMEOUT, 1),
    ],
    ids=["http500", "reset", "stall"],
)  # fmt: skip
def test_a_failed_tokenize_is_a_recorded_attempt_and_an_error_in_the_dialects_shape(
    make_stack: Any, faulty: FaultyEngine, fault: Reply, status: int, kind: ErrorKind,
    attempts: int,
) -> None:  # fmt: skip
    """It used to leave no record (the call's sequence number used up), and the
    client a 502 whatever the failure."""
    faulty.routes["/tokenize"] = fault
    stack = make_stack(
        {"turns": [{"text": "never"}]},
        engine_url=faulty.url,
        engine={"max_model_len": 4096, "read_timeout_s": 0.5, "max_attempts": 2},
    )
    sid, key = stack.new_session()
    calls = [(dialect, stream) for dialect in PATHS for stream in (False, True)]
    for dialect, stream in calls:
        message = assert_dialect_error(dialect, _call(stack, key, dialect, stream=stream), status)
        assert "/tokenize" in message or "fell over" in message, message
    records = stack.records(sid)
    assert [(r.seq, r.attempt) for r in records] == [
        (seq, attempt) for seq in range(1, len(calls) + 1) for attempt in range(1, attempts + 1)
    ]
    for record in records:
        assert record.status is RecordStatus.FAILED
        assert record.error is not None and record.error.kind is kind
        assert record.error.status == status
        # The request that failed, as sent: the conversation to count.
        assert record.engine_request["add_generation_prompt"] is True
        assert record.engine_request["messages"][-1]["content"] == "hi"
    assert faulty.paths("POST", "/v1/chat/completions") == [], "no call went ahead uncounted"
    # Each attempt's count carried its record's key (for the engine's logs).
    assert set(faulty.paths("POST", "/tokenize")) == {f"{sid}/{r.seq}.{r.attempt}" for r in records}


def test_a_503_from_tokenize_is_retried_as_a_new_recorded_attempt(
    make_stack: Any, faulty: FaultyEngine
) -> None:
    """A 503 on the generation request was retried, one on its count was not."""
    answers = [Reply(status=503, body=b'{"error": {"message": "loading"}}'), COUNT]
    faulty.routes["/tokenize"] = lambda headers: answers.pop(0)
    stack = make_stack(
        {"turns": [{"text": "never"}]}, engine_url=faulty.url, engine={"max_model_len": 4096}
    )
    sid, key = stack.new_session()
    reply = _call(stack, key)
    assert reply.status_code == 200, reply.text
    records = stack.records(sid)
    assert [(r.seq, r.attempt, r.status) for r in records] == [
        (1, 1, RecordStatus.FAILED),
        (1, 2, RecordStatus.COMPLETED),
    ]
    failed, done = records
    assert failed.error is not None and failed.error.kind is ErrorKind.ENGINE_HTTP
    assert "loading" in failed.error.message
    assert done.engine_request["max_tokens"] == 4096 - 12, "the limit the count allowed"
    assert faulty.paths("POST", "/tokenize") == [f"{sid}/1.1", f"{sid}/1.2"]


def test_a_stalled_tokenize_holds_only_its_own_call(make_stack: Any, faulty: FaultyEngine) -> None:
    """Session A's count stalls until released; session B's call is served
    meanwhile; then A's call completes too."""
    release = threading.Event()
    stack = make_stack(
        {"turns": [{"text": "never"}]}, engine_url=faulty.url, engine={"max_model_len": 4096}
    )
    (sid_a, key_a), (sid_b, key_b) = stack.new_session(), stack.new_session()

    def tokenize(headers: Message) -> Reply:
        stalled = headers.get("x-polar-session") == sid_a
        return Reply(body=COUNT.body, hold=release if stalled else None)

    faulty.routes["/tokenize"] = tokenize
    replies: list[Any] = []
    a = threading.Thread(target=lambda: replies.append(_call(stack, key_a)))
    a.start()
    try:
        deadline = time.monotonic() + 60
        while f"{sid_a}/1.1" not in faulty.paths("POST", "/tokenize"):
            assert time.monotonic() < deadline, "A's count never reached the engine"
            time.sleep(0.01)
        b = _call(stack, key_b)
        assert b.status_code == 200, b.text
        assert a.is_alive() and not replies, "A is still waiting for its count"
    finally:
        release.set()
        a.join(timeout=60)
    assert replies[0].status_code == 200, replies[0].text
    for sid in (sid_a, sid_b):
        assert [r.status for r in stack.records(sid)] == [RecordStatus.COMPLETED]


def test_a_stalled_v1_models_is_asked_at_start_and_never_on_a_calls_path(
    make_stack: Any, faulty: FaultyEngine
) -> None:
    """Without ``engine.max_model_len`` the gateway used to ask ``GET /v1/models``
    on every call until it got an answer, one call at a time behind a lock: a
    stalled answer held every session. Now it asks at start (bounded by the
    read timeout) and again in the background; calls go ahead meanwhile, and
    ``/health`` says that no context length is known."""
    stalled = Reply(body=MODELS_WITH_LENGTH.body, hold=threading.Event())
    faulty.routes["/v1/models"] = stalled
    stack = make_stack(
        {"turns": [{"text": "never"}]}, engine_url=faulty.url, engine={"read_timeout_s": 1.0}
    )
    keys = [stack.new_session()[1] for _ in range(24)]
    replies: list[Any] = []
    threads = [threading.Thread(target=lambda k=k: replies.append(_call(stack, k))) for k in keys]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(r.status_code for r in replies) == [200] * len(keys)
    asked = len(faulty.paths("GET", "/v1/models"))
    assert 1 <= asked < len(keys), f"asked {asked} times for {len(keys)} calls"
    health = httpx.get(f"{stack.url}/health").json()
    assert health["context"]["source"] == "asking", health
    assert "engine.max_model_len" in health["context"]["warning"]
    # The engine answers at last: the background question learns the length.
    faulty.routes["/v1/models"] = MODELS_WITH_LENGTH
    stalled.hold.set()  # type: ignore[union-attr]
    deadline = time.monotonic() + 90
    while httpx.get(f"{stack.url}/health").json()["context"]["source"] != "engine":
        assert time.monotonic() < deadline, "the gateway never learned the context length"
        time.sleep(0.2)
    assert httpx.get(f"{stack.url}/health").json()["context"] == {
        "max_model_len": 4096,
        "source": "engine",
    }


@pytest.mark.parametrize(
    ("models", "engine", "expected"),
    [
        (Reply(body=b'{"data": [{"id": "scripted"}]}'), {}, (None, "unknown", 1)),
        (Reply(status=404), {}, (None, "unknown", 1)),
        (MODELS_WITH_LENGTH, {}, (4096, "engine", 1)),
        (MODELS_WITH_LENGTH, {"max_model_len": 2048}, (2048, "configured", 0)),
    ],
    ids=["no-length", "no-route", "engine", "configured"],
)
def test_health_says_where_the_context_length_comes_from_and_warns_when_none(
    make_stack: Any,
    faulty: FaultyEngine,
    models: Reply,
    engine: dict[str, Any],
    expected: tuple[Any, ...],
) -> None:
    faulty.routes["/v1/models"] = models
    faulty.routes["/tokenize"] = COUNT
    stack = make_stack({"turns": [{"text": "never"}]}, engine_url=faulty.url, engine=engine)
    context = httpx.get(f"{stack.url}/health").json()["context"]
    assert (context["max_model_len"], context["source"]) == expected[:2]
    assert ("warning" in context) is (expected[0] is None)
    _, key = stack.new_session()
    assert _call(stack, key).status_code == 200
    assert len(faulty.paths("GET", "/v1/models")) == expected[2], "asked once, at start"
    # The limit: the rest of the context when it is known, else none sent.
    body = orjson.loads(faulty.requests[-1])
    assert body.get("max_tokens") == (None if expected[0] is None else expected[0] - 12)
