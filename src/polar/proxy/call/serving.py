"""The request cycle every dialect shares: authenticate, parse, relay, encode.

A dialect supplies a :class:`DialectCodec` (its translate and stream modules
behind one object); :func:`serve` does the rest, as a plain ASGI handler:

* auth before anything else, so an unknown key is refused without reading
  the body or touching the engine;
* then the body's limits (:mod:`polar.proxy.front.inbound`), before any parsing
  beyond JSON; a large body is decoded and validated on an offload worker,
  not on the event loop;
* streaming replies commit HTTP headers only once the engine produced its
  first token (prompt ids, reported for each attempt, do not count), so a
  failure before that, retries included, still gets a real error status;
* a client that disconnects mid-call cancels the engine call, which the relay
  records as aborted;
* every :class:`~polar.proxy.errors.ProxyError` is rendered by the codec,
  anything else becomes a 500 in the dialect's shape and a one-line log
  (never the request body).
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import AsyncGenerator, Mapping
from typing import Any, Protocol, assert_never

from polar.ir import (
    ChatRequest,
    Completion,
    Delta,
    Dialect,
    EngineEvent,
    Finish,
    PromptTokens,
    TokenLogprob,
)
from polar.proxy.call.readynext import Pending, poll_next
from polar.proxy.call.relay import CallInput
from polar.proxy.errors import ProxyError
from polar.proxy.front.asgi import (
    SSE,
    DisconnectWatch,
    Receive,
    Scope,
    Send,
    headers_of,
    read_body,
    send_body,
)
from polar.proxy.front.inbound import api_key_of, check_counts, json_object
from polar.proxy.gateway import Gateway
from polar.proxy.logtext import describe

_log = logging.getLogger(__name__)


class StreamEncoder(Protocol):
    def start(self, prompt_tokens: int) -> bytes:
        """The opening events, once the engine has started (prompt length known)."""
        ...

    def delta(self, event: Delta) -> bytes: ...
    def finish(self, event: Finish) -> bytes: ...
    def error(self, error: ProxyError) -> bytes: ...


class DialectCodec(Protocol):
    dialect: Dialect
    messages_field: str
    """The top-level field holding the conversation (``messages``, ``input``)."""

    def parse(self, body: dict[str, Any], gateway: Gateway) -> ChatRequest:
        """Validate and translate a request body (raises ``ProxyError``)."""
        ...

    def error_body(self, error: ProxyError) -> bytes: ...

    def reply_body(
        self, request: ChatRequest, completion: Completion, details: list[TokenLogprob] | None
    ) -> bytes:
        """The non-streamed reply (JSON)."""
        ...

    def encoder(self, request: ChatRequest) -> StreamEncoder: ...


class InternalError(ProxyError):
    status = 500
    code = "internal_error"


# Bodies larger than this are decoded and validated on an offload worker.
OFFLOAD_BYTES = 256 << 10


def parse_body(
    raw: bytes,
    codec: DialectCodec,
    gateway: Gateway,
    path_fields: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], ChatRequest]:
    """Decode, check against the limits, validate and translate a model request.
    ``path_fields`` (what the path says, Gemini's model) go into the body, over
    the same fields sent in it, so the record keeps them."""
    body = json_object(raw, gateway.body_limits)
    if path_fields:
        body.update(path_fields)
    check_counts(body, gateway.body_limits, messages_field=codec.messages_field)
    return body, codec.parse(body, gateway)


async def read_request(
    receive: Receive,
    headers: dict[str, str],
    codec: DialectCodec,
    gateway: Gateway,
    path_fields: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], ChatRequest]:
    raw = await read_body(
        receive, gateway.config.limits.max_body_bytes, headers.get("content-length")
    )
    if len(raw) > OFFLOAD_BYTES:
        return await gateway.offload.run(len(raw), parse_body, raw, codec, gateway, path_fields)
    return parse_body(raw, codec, gateway, path_fields)


async def serve(
    scope: Scope,
    receive: Receive,
    send: Send,
    codec: DialectCodec,
    gateway: Gateway,
    path_fields: Mapping[str, Any] | None = None,
) -> None:
    arrived = time.time()
    headers = headers_of(scope)
    try:
        session = gateway.authenticate(api_key_of(scope["headers"], scope.get("query_string", b"")))
        body, chat = await read_request(receive, headers, codec, gateway, path_fields)
    except ProxyError as error:
        await send_body(send, error.status, codec.error_body(error))
        return
    events = gateway.relay.run(
        CallInput(
            session=session, dialect=codec.dialect, request=chat, original=body, arrived=arrived
        )
    )
    watch = DisconnectWatch(receive, scope)
    try:
        if chat.stream:
            await _stream(send, codec, chat, events)
        else:
            await _collect(send, codec, chat, events)
    except asyncio.CancelledError:
        if not (watch.disconnected or gateway.calls.was_cut(asyncio.current_task())):
            raise
        # The client left, or its session ended; the relay has recorded the call as aborted.
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
    finally:
        watch.done()
        await events.aclose()


def internal(codec: DialectCodec, error: Exception) -> ProxyError:
    """A bug, logged in one line with where it happened (never the request)."""
    where = _origin(error)
    _log.error("internal error serving %s: %s (%s)", codec.dialect.value, describe(error), where)
    return InternalError(f"internal gateway error: {describe(error, 200)}")


def _origin(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"


async def _error(send: Send, codec: DialectCodec, error: Exception) -> None:
    if not isinstance(error, ProxyError):
        error = internal(codec, error)
    await send_body(send, error.status, codec.error_body(error))


async def _collect(
    send: Send,
    codec: DialectCodec,
    chat: ChatRequest,
    events: AsyncGenerator[EngineEvent, None],
) -> None:
    """One JSON reply: the message the relay recorded (its last event carries it),
    and the top logprobs of each token when the client asked for them."""
    details: list[TokenLogprob] | None = [] if chat.top_logprobs is not None else None
    try:
        async for event in events:
            match event:
                case PromptTokens():
                    continue
                case Delta():
                    if details is not None and event.details:
                        details.extend(event.details)
                    continue
                case Finish():
                    if event.message is None:
                        raise InternalError("the relay finished a call without its message")
                    completion = Completion(
                        finish_reason=event.reason,
                        message=event.message,
                        usage=event.usage,
                        matched_stop=event.matched_stop,
                    )
                    await send_body(send, 200, codec.reply_body(chat, completion, details))
                    return
                case _:
                    assert_never(event)
        raise InternalError("engine call ended without a result")
    except Exception as error:
        await _error(send, codec, error)


async def _stream(
    send: Send,
    codec: DialectCodec,
    chat: ChatRequest,
    events: AsyncGenerator[EngineEvent, None],
) -> None:
    prompt_tokens = 0
    try:
        event = await anext(events)
        # Prompt ids come first, once per attempt: a retried call reports them
        # again. Headers wait for the first token, so every failure until then
        # gets its real status.
        while isinstance(event, PromptTokens):
            prompt_tokens = len(event.ids)
            event = await anext(events)
    except StopAsyncIteration:
        await _error(send, codec, InternalError("engine call ended without a result"))
        return
    except Exception as error:
        await _error(send, codec, error)
        return
    encoder = codec.encoder(chat)
    await send({"type": "http.response.start", "status": 200, "headers": SSE})
    pending = encoder.start(prompt_tokens)
    while True:
        if isinstance(event, Finish):
            await send({"type": "http.response.body", "body": pending + encoder.finish(event)})
            return
        if isinstance(event, Delta):
            pending += encoder.delta(event)
        try:
            # Events that are already here go out in one write with these.
            got = poll_next(events)
            if not isinstance(got, Pending):
                event = got
                continue
            if pending:
                await send({"type": "http.response.body", "body": pending, "more_body": True})
                pending = b""
            event = await got
        except StopAsyncIteration:
            failure: ProxyError = InternalError("engine call ended without a result")
        except ProxyError as error:
            failure = error
        except Exception as error:
            failure = internal(codec, error)
        else:
            continue
        await send({"type": "http.response.body", "body": pending + encoder.error(failure)})
        return
