"""``POST /v1/messages`` (``?beta=true`` too), ``POST /v1/messages/count_tokens``."""

from __future__ import annotations

import secrets
from typing import Any

import orjson

from polar.ir import ChatRequest, Completion, TokenLogprob
from polar.proxy.call.serving import serve
from polar.proxy.dialects import handlers
from polar.proxy.dialects.anthropic_messages.dialect import COUNT_TOKENS, DIALECT, MESSAGES
from polar.proxy.dialects.anthropic_messages.protocol import (
    KNOWN_EXTRAS,
    CountTokensRequest,
    MessagesRequest,
)
from polar.proxy.dialects.anthropic_messages.stream import EventEncoder
from polar.proxy.dialects.anthropic_messages.translate import message_json, request_to_ir
from polar.proxy.dialects.spec import Mounted
from polar.proxy.errors import ProxyError
from polar.proxy.front.asgi import Receive, Scope, Send
from polar.proxy.front.inbound import check_counts, validate
from polar.proxy.gateway import Gateway


def _message_id() -> str:
    return f"msg_{secrets.token_hex(12)}"


class AnthropicCodec:
    dialect = DIALECT.name
    messages_field = "messages"

    def parse(self, body: dict[str, Any], gateway: Gateway) -> ChatRequest:
        wire = handlers.read_wire(MessagesRequest, body, gateway, self, KNOWN_EXTRAS)
        return request_to_ir(wire)

    def error_body(self, error: ProxyError) -> bytes:
        return DIALECT.error_body(error)

    def reply_body(
        self, request: ChatRequest, completion: Completion, details: list[TokenLogprob] | None
    ) -> bytes:
        return orjson.dumps(
            message_json(
                completion, request, message_id=_message_id(), matched_stop=completion.matched_stop
            )
        )

    def encoder(self, request: ChatRequest) -> EventEncoder:
        return EventEncoder(request, message_id=_message_id())


def mount(gateway: Gateway) -> Mounted:
    codec = AnthropicCodec()

    async def messages(scope: Scope, receive: Receive, send: Send) -> None:
        await serve(scope, receive, send, codec, gateway)

    def count_request(body: dict[str, Any]) -> ChatRequest:
        check_counts(body, gateway.body_limits, messages_field=codec.messages_field)
        wire = validate(CountTokensRequest, body)
        return request_to_ir(
            MessagesRequest.model_validate({**wire.model_dump(exclude_unset=True), "max_tokens": 1})
        )

    async def count_tokens(scope: Scope, receive: Receive, send: Send) -> None:
        await handlers.count_tokens(
            scope,
            receive,
            send,
            codec,
            gateway,
            request_of=count_request,
            reply=lambda count: {"input_tokens": count},
            key_in_query=False,
        )

    return Mounted(hot={MESSAGES: messages, COUNT_TOKENS: count_tokens})
