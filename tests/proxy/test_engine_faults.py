"""Engine replies the gateway cannot use: each a recorded failure and a 5xx in the dialect's shape.

The engine is :class:`~support.faulty.FaultyEngine`, a real HTTP server that
answers what it is told (a real vLLM cannot be made to send a wrong shape).
"""

from __future__ import annotations

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
    client_headers,
    request_body,
)


@pytest.fixture
def faulty() -> Any:
    engine = FaultyEngine()
    yield engine
    engine.stop()


def _chat_reply(token_ids: list[Any], logprobs: list[Any]) -> bytes:
    return orjson.dumps(
        {
            "prompt_token_ids": [1, 2, 3],
            "choices": [
                {
                    "message": {"role": "assistant", "content": "x"},
                    "token_ids": token_ids,
                    "logprobs": {
                        "content": [{"token": "x", "logprob": lp, "bytes": None} for lp in logprobs]
                    },
                    "finish_reason": "stop",
                }
            ],
        }
    )


BAD_REPLIES = [
    (b"[]", "not an object"),
    (b"null", "not an object"),
    (b"42", "not an object"),
    (b'{"choices": ["x"]}', "not an object"),
    (b'{"choices": []}', "without choices"),
    (b"not json at all", "invalid JSON"),
    (_chat_reply([-1], [-0.5]), "not a token id"),
    (_chat_reply([7, 1.5], [-0.5, -0.5]), "not a token id"),
    (_chat_reply([7, True], [-0.5, -0.5]), "not a token id"),
    (
        b'{"prompt_token_ids": [1], "choices": [{"message": {"content": "x"}, "token_ids": '
        b'[4294967296], "logprobs": {"content": [{"token": "x", "logprob": -1}]}, '
        b'"finish_reason": "stop"}]}',
        "not a token id",
    ),
    (_chat_reply([7], ["high"]), "not a number"),
    (_chat_reply([7, 8], [-0.5]), "2 token ids but 1 logprobs"),
]


def test_wrong_shapes_and_bad_ids_are_recorded_502s(make_stack: Any, faulty: FaultyEngine) -> None:
    stack = make_stack({"turns": [{"text": "never"}]}, engine_url=faulty.url)
    sid, key = stack.new_session()
    with httpx.Client(base_url=stack.url, headers=client_headers(key), timeout=30) as client:
        for i, (body, needle) in enumerate(BAD_REPLIES):
            faulty.reply = Reply(body=body)
            dialect = list(PATHS)[i % 3]
            reply = client.post(PATHS[dialect], json=request_body(dialect, stream=False))
            message = assert_dialect_error(dialect, reply, 502)
            assert needle in message, (body, message)
        assert client.get("/health").status_code == 200
    records = stack.records(sid)
    assert [r.seq for r in records] == list(range(1, len(BAD_REPLIES) + 1)), "one record per call"
    for record in records:
        assert record.status is RecordStatus.FAILED
        assert record.error is not None and record.error.kind is ErrorKind.ENGINE_PROTOCOL
        assert record.output_ids == (), "nothing of a bad reply is kept as sampled"


def test_token_mode_streams_get_a_real_status_when_the_engine_fails_before_the_first_token(
    make_stack: Any, faulty: FaultyEngine
) -> None:
    """Headers wait for the first sampled token, so a streamed call whose engine
    fails first gets the failure's own status (502, 504) and an error body in its
    dialect's shape, never a 200 with an error inside the stream."""
    stack = make_stack(
        {"turns": [{"text": "never"}]},
        engine_url=faulty.url,
        capture="token_in_token_out",
        engine={"read_timeout_s": 0.5, "max_attempts": 1},
    )
    sid, key = stack.new_session()
    sse = "text/event-stream"
    failures = [
        (Reply(status=500, body=b'{"error": {"message": "engine fell over"}}'), 502, "fell over"),
        (Reply(body=b'data: {"choices": [{"token_ids": [-3]}]}\n\n', content_type=sse), 502, "id"),
        (Reply(body=b"data: []\n\n", content_type=sse), 502, "not an object"),
        (Reply(body=b"data: [DONE]\n\n", content_type=sse), 502, "ended before finishing"),
        (Reply(body=b"data: [DONE]\n\n", content_type=sse, delay_s=2.0), 504, "timed out"),
    ]
    calls = 0
    with httpx.Client(base_url=stack.url, headers=client_headers(key), timeout=30) as client:
        for dialect in PATHS:
            for engine_reply, status, needle in failures:
                faulty.reply = engine_reply
                with client.stream(
                    "POST", PATHS[dialect], json=request_body(dialect, stream=True)
                ) as reply:
                    reply.read()
                    assert reply.headers["content-type"].startswith("application/json")
                    message = assert_dialect_error(dialect, reply, status)
                    assert needle in message, (dialect, message)
                calls += 1
    records = stack.records(sid)
    assert len(records) == calls
    assert all(r.status is RecordStatus.FAILED and r.prompt_ids for r in records)
    assert {r.error.kind for r in records if r.error} == {
        ErrorKind.ENGINE_HTTP,
        ErrorKind.ENGINE_PROTOCOL,
        ErrorKind.ENGINE_TIMEOUT,
    }


def test_a_reset_kept_alive_connection_is_retried_as_a_new_recorded_attempt(
    make_stack: Any, faulty: FaultyEngine
) -> None:
    """The HTTP pool used to resend on its own under the same request id, and
    the first send was never recorded. Now each send is an attempt with a record."""
    faulty.reply = Reply(body=_chat_reply([7, 8], [-0.5, -0.25]))
    stack = make_stack({"turns": [{"text": "never"}]}, engine_url=faulty.url)
    sid, key = stack.new_session()
    body = request_body(Dialect.OPENAI_CHAT, stream=False)
    with httpx.Client(base_url=stack.url, headers=client_headers(key), timeout=30) as client:
        assert client.post(PATHS[Dialect.OPENAI_CHAT], json=body).status_code == 200
        faulty.resets = 1  # the pooled connection dies as the next request arrives
        assert client.post(PATHS[Dialect.OPENAI_CHAT], json=body).status_code == 200
    assert faulty.request_ids == [f"{sid}/1.1", f"{sid}/2.1", f"{sid}/2.2"]
    records = stack.records(sid)
    assert [(r.seq, r.attempt, r.status) for r in records] == [
        (1, 1, RecordStatus.COMPLETED),
        (2, 1, RecordStatus.FAILED),
        (2, 2, RecordStatus.COMPLETED),
    ]
    assert records[1].error is not None and records[1].error.kind is ErrorKind.ENGINE_UNAVAILABLE


def test_an_engine_gone_silent_mid_stream_fails_after_the_idle_timeout(make_stack: Any) -> None:
    """The scripted engine sends its first chunks at once, then one token a second;
    the idle timeout (0.3 s) ends the call long before the read timeout (30 s):
    a 504 if no token had reached the client yet, else an error event in the stream."""
    stack = make_stack(
        {"turns": [{"text": "slow words here"}]},
        token_delay_s=1.0,
        engine={"read_timeout_s": 30, "idle_timeout_s": 0.3, "max_attempts": 1},
    )
    sid, key = stack.new_session()
    body = request_body(Dialect.OPENAI_CHAT, stream=True)
    with httpx.Client(base_url=stack.url, headers=client_headers(key), timeout=30) as client:
        reply = client.post(PATHS[Dialect.OPENAI_CHAT], json=body)
    if reply.status_code == 200:
        assert 'data: {"error"' in reply.text and "went silent" in reply.text, reply.text
    else:
        assert "went silent" in assert_dialect_error(Dialect.OPENAI_CHAT, reply, 504)
    (record,) = stack.records(sid)
    assert record.error is not None and record.error.kind is ErrorKind.ENGINE_TIMEOUT


def _vllm_chat_stream(tokenizer: Any, words: list[str], *, fail_after: int | None = None) -> bytes:
    """vLLM's chat stream for ``words`` (one sampled id each), every chunk in one
    write: what an engine under load sends when the gateway reads late."""
    head = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    chunks: list[dict[str, Any]] = [
        {
            **head,
            "prompt_token_ids": [1, 2, 3],
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
        }
    ]
    for i, word in enumerate(words):
        if i == fail_after:
            chunks.append({"error": {"message": "engine fell over mid-burst"}})
            break
        (token,) = tokenizer.encode(word, add_special_tokens=False)
        last = i == len(words) - 1
        chunks.append(
            {
                **head,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"content": word},
                        "logprobs": {"content": [{"token": word, "logprob": -0.25 - i}]},
                        "token_ids": [token],
                        "finish_reason": "stop" if last else None,
                    }
                ],
            }
        )
    data = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks)
    return data + (b"data: [DONE]\n\n" if fail_after is None else b"")


def _streamed(client: httpx.Client) -> list[dict[str, Any]]:
    body = request_body(Dialect.OPENAI_CHAT, stream=True)
    with client.stream("POST", PATHS[Dialect.OPENAI_CHAT], json=body) as reply:
        assert reply.status_code == 200, reply.read()
        return [orjson.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: {")]


def test_steps_an_engine_sent_together_reach_the_client_together_and_the_record_whole(
    make_stack: Any, faulty: FaultyEngine, tokenizer: Any
) -> None:
    """Eight steps in one network read are one delta through the gateway: one
    content chunk for the client (nothing waited for), every id and logprob on
    the record; a failure later in the same read keeps the steps before it."""
    words = ["one", " two", " three", " four", " five", " six", " seven", " eight"]
    ids = [tokenizer.encode(w, add_special_tokens=False)[0] for w in words]
    stack = make_stack({"turns": [{"text": "never"}]}, engine_url=faulty.url)
    sid, key = stack.new_session()
    sse = "text/event-stream"
    with httpx.Client(base_url=stack.url, headers=client_headers(key), timeout=30) as client:
        faulty.reply = Reply(body=_vllm_chat_stream(tokenizer, words), content_type=sse)
        chunks = _streamed(client)
        faulty.reply = Reply(
            body=_vllm_chat_stream(tokenizer, words, fail_after=3), content_type=sse
        )
        failed = _streamed(client)
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    _one_chunk_then_kept(stack.records(sid), chunks, failed, ids, "".join(words), kept=3)


def _one_chunk_then_kept(
    records: list[Any],
    chunks: list[dict[str, Any]],
    failed: list[dict[str, Any]],
    ids: list[int],
    text: str,
    *,
    kept: int,
) -> None:
    """A burst reached the client as one chunk of ``text`` and its record whole;
    the burst that failed after ``kept`` steps kept those, for client and record."""
    texts = [
        c["choices"][0]["delta"]["content"]
        for c in chunks
        if c["choices"] and c["choices"][0]["delta"].get("content")
    ]
    assert texts == [text]
    failed_texts = [c["choices"][0]["delta"].get("content") for c in failed if c.get("choices")]
    assert "".join(t for t in failed_texts if t) == "one two three"
    assert "mid-burst" in failed[-1]["error"]["message"]
    done, broken = records
    assert done.status is RecordStatus.COMPLETED
    assert done.output_ids == tuple(ids)
    assert done.output_logprobs == tuple(-0.25 - i for i in range(len(ids)))
    assert broken.status is RecordStatus.FAILED
    assert broken.error is not None and broken.error.kind is ErrorKind.ENGINE_PROTOCOL
    assert broken.output_ids == tuple(ids[:kept]), "the steps before the failure are kept"


def _vllm_completions_stream(ids: list[int], *, fail_after: int | None = None) -> bytes:
    """vLLM's completions stream (token-in/token-out capture) for ``ids``, one
    step per chunk, every chunk in one write."""
    head = {"id": "cmpl-x", "object": "text_completion", "created": 1, "model": "m"}
    chunks: list[dict[str, Any]] = []
    for i, token in enumerate(ids):
        if i == fail_after:
            chunks.append({"error": {"message": "engine fell over mid-burst"}})
            break
        choice = {
            "index": 0,
            "text": "",
            "token_ids": [token],
            "logprobs": {"token_logprobs": [-0.25 - i]},
            "finish_reason": "stop" if i == len(ids) - 1 else None,
        }
        chunks.append({**head, "choices": [choice]})
    data = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks)
    return data + (b"data: [DONE]\n\n" if fail_after is None else b"")


def test_token_steps_sent_together_are_one_delta_and_a_failure_keeps_those_before_it(
    make_stack: Any, faulty: FaultyEngine, tokenizer: Any
) -> None:
    """The same through token-in/token-out capture, whose engine gathers a read's
    steps itself: one chunk of text for the client, every id and logprob on the
    record, and the steps before a failure in the same read kept."""
    words = ["</think>", "one", " two", " three", " four", " five", " six", "<|im_end|>"]
    ids = [tokenizer.convert_tokens_to_ids(w) for w in words[:1]] + [
        tokenizer.encode(w, add_special_tokens=False)[0] for w in words[1:]
    ]
    stack = make_stack(
        {"turns": [{"text": "never"}]}, engine_url=faulty.url, capture="token_in_token_out"
    )
    sid, key = stack.new_session()
    sse = "text/event-stream"
    with httpx.Client(base_url=stack.url, headers=client_headers(key), timeout=30) as client:
        faulty.reply = Reply(body=_vllm_completions_stream(ids), content_type=sse)
        chunks = _streamed(client)
        faulty.reply = Reply(body=_vllm_completions_stream(ids, fail_after=4), content_type=sse)
        failed = _streamed(client)
    _one_chunk_then_kept(
        stack.records(sid), chunks, failed, ids, "one two three four five six", kept=4
    )
