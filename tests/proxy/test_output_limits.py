"""The gateway's max-tokens policy end to end, in every dialect and both capture modes.

Token mode runs the real embedded engine on a tiny random model whose context
is 40 tokens (so "the rest of the context" is about 30 tokens, sampled in
seconds); the gateway learns that length from the engine's ``GET /v1/models``.
Engine-rendered mode runs the scripted engine (no vLLM needed) with the
context length configured, the prompt counted by the engine's ``/tokenize``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from openai import OpenAI

from polar.ir import CompletionRecord, EditKind, FinishReason, RecordStatus
from polar.proxy.app import create_app
from polar.proxy.config import GatewayConfig
from polar.proxy.engines.embedded import ModelRunner, create_engine_app
from polar.proxy.gateway import Gateway
from polar.proxy.store import SqliteStore
from polar.serverthread import ServerThread
from polar.tinymodel.build import TinyModelSpec, build_tiny_model

CONTEXT = 40
ADMIN = "0123456789abcdef0123"


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    spec = TinyModelSpec(max_position_embeddings=CONTEXT)
    model = build_tiny_model(tmp_path_factory.mktemp("model") / "tiny", spec)
    runner = ModelRunner(model, max_batch=2)
    try:
        with ServerThread(create_engine_app(runner, served_name="tiny")) as server:
            yield server.url
    finally:
        runner.close()


@pytest.fixture
def gateway(engine: str, tmp_path: Path) -> Iterator[tuple[str, str, Callable[[], Any]]]:
    """A token-mode gateway in front of the engine: (url, session key, its only record)."""
    db = tmp_path / "r.db"
    config = GatewayConfig.model_validate(
        {
            "admin_token": ADMIN,
            "capture": "token_in_token_out",
            "engine": {"kind": "embedded", "base_url": engine, "model": "tiny"},
            "store": {"path": str(db)},
        }
    )
    with ServerThread(create_app(Gateway(config))) as server:
        created = httpx.post(
            f"{server.url}/admin/sessions", headers={"authorization": f"Bearer {ADMIN}"}, json={}
        ).json()

        def only_record() -> CompletionRecord:
            (record,) = SqliteStore(db).records(created["session_id"])
            return record

        yield server.url, created["api_key"], only_record


def check_limit(record: CompletionRecord, kind: EditKind, context: int = CONTEXT) -> int:
    """The record shows the applied limit (edit and engine body) and kept to it."""
    assert record.status is RecordStatus.COMPLETED
    applied = context - len(record.prompt_ids)
    assert record.engine_request["max_tokens"] == applied
    (edit,) = [e for e in record.edits if e.kind is kind]
    assert f"max_tokens {applied} applied" in edit.detail
    assert len(record.output_ids) <= applied
    if record.finish_reason is FinishReason.LENGTH:
        assert len(record.output_ids) == applied
    return applied


def chat_without_a_limit(url: str, key: str) -> None:
    with OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0) as client:
        reply = client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "hi"}]
        )
    assert reply.choices[0].finish_reason in ("length", "stop")


def responses_without_a_limit(url: str, key: str) -> None:
    with OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0) as client:
        events = list(client.responses.create(model="policy", input="hi", stream=True))
    assert events[-1].type in ("response.completed", "response.incomplete")


def messages_far_over_the_context(url: str, key: str) -> None:
    client = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)
    with client.messages.stream(
        model="policy", max_tokens=1_000_000, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        final = stream.get_final_message()
    client.close()
    assert final.stop_reason in ("max_tokens", "end_turn")


@pytest.mark.parametrize(
    ("call", "kind"),
    [
        (chat_without_a_limit, EditKind.DEFAULTED_MAX_TOKENS),
        (responses_without_a_limit, EditKind.DEFAULTED_MAX_TOKENS),
        (messages_far_over_the_context, EditKind.CLAMPED_MAX_TOKENS),
    ],
    ids=["openai_chat-no-limit", "openai_responses-no-limit", "anthropic-1M"],
)
def test_token_mode_calls_complete_with_the_recorded_limit(
    gateway: tuple[str, str, Callable[[], CompletionRecord]],
    call: Callable[[str, str], None],
    kind: EditKind,
) -> None:
    url, key, only_record = gateway
    call(url, key)
    applied = check_limit(only_record(), kind)
    assert applied > 16  # more than the engines' own default


def test_a_prompt_filling_the_context_is_a_400_in_the_dialects_shape(
    gateway: tuple[str, str, Callable[[], CompletionRecord]],
) -> None:
    url, key, _ = gateway
    reply = httpx.post(
        f"{url}/v1/messages",
        headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
        json={
            "model": "policy",
            "max_tokens": 10,
            "messages": [{"role": "user", "content": "word " * CONTEXT}],
        },
        timeout=60,
    )
    assert reply.status_code == 400
    error = reply.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert f"maximum context length is {CONTEXT} tokens" in error["error"]["message"]


@pytest.mark.parametrize("max_tokens", [None, 1_000_000, 7])
def test_engine_rendered_mode_applies_the_same_policy(
    make_stack: Any, max_tokens: int | None
) -> None:
    stack = make_stack({"turns": [{"text": "ok"}], "cycle": True}, engine={"max_model_len": 200})
    session, key = stack.new_session()
    client = stack.openai(key)
    extra = {} if max_tokens is None else {"max_tokens": max_tokens}
    client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "hi"}], **extra
    )
    (record,) = stack.records(session)
    if max_tokens == 7:
        assert record.engine_request["max_tokens"] == 7 and not record.edits
        return
    kind = EditKind.DEFAULTED_MAX_TOKENS if max_tokens is None else EditKind.CLAMPED_MAX_TOKENS
    check_limit(record, kind, context=200)
