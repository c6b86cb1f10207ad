"""``POST /v1/messages`` (``?beta=true`` too), ``POST /v1/messages/count_tokens``."""

from __future__ import annotations

import secrets
from typing import Any

import orjson

from polar.ir import ChatRequest, Completion, Dialect, TokenLogprob
from polar.proxy.asgi import ASGIApp, Receive, Scope, Send, headers_of, read_body, send_body
from polar.proxy.dialects.anthropic_messages.protocol import (
    KNOWN_EXTRAS,
    CountTokensRequest,
    MessagesRequest,
)
from polar.proxy.dialects.anthropic_messages.stream import EventEncoder
from polar.proxy.dialects.anthropic_messages.translate import (
    error_json,
    message_json,
    request_to_ir,
)
from polar.proxy.errors import ProxyError
from polar.proxy.gateway import Gateway
from polar.proxy.inbound import api_key_of, check_counts, json_object, validate
from polar.proxy.serving import internal, serve


def _message_id() -> str:
    return f"msg_{secrets.token_hex(12)}"


class AnthropicCodec:
    dialect = Dialect.ANTHROPIC_MESSAGES
    messages_field = "messages"

    def parse(self, body: dict[str, Any], gateway: Gateway) -> ChatRequest:
        wire = validate(MessagesRequest, body)
        if wire.model_extra:
            gateway.note_unknown_fields(self.dialect, set(wire.model_extra) - KNOWN_EXTRAS)
        return request_to_ir(wire)

    def error_body(self, error: ProxyError) -> bytes:
        return orjson.dumps(error_json(error))

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


def hot_routes(gateway: Gateway) -> dict[tuple[str, str], ASGIApp]:
    codec = AnthropicCodec()

    async def messages(scope: Scope, receive: Receive, send: Send) -> None:
        await serve(scope, receive, send, codec, gateway)

    async def count_tokens(scope: Scope, receive: Receive, send: Send) -> None:
        headers = headers_of(scope)
        try:
            gateway.authenticate(api_key_of(scope["headers"]))
            raw = await read_body(
                receive, gateway.config.limits.max_body_bytes, headers.get("content-length")
            )
            body = json_object(raw, gateway.body_limits)
            check_counts(body, gateway.body_limits, messages_field=codec.messages_field)
            wire = validate(CountTokensRequest, body)
            request = request_to_ir(
                MessagesRequest.model_validate(
                    {**wire.model_dump(exclude_unset=True), "max_tokens": 1}
                )
            )
            count = await gateway.capture.count_tokens(request)
        except ProxyError as error:
            await send_body(send, error.status, codec.error_body(error))
            return
        except Exception as error:
            await send_body(send, 500, codec.error_body(internal(codec, error)))
            return
        await send_body(send, 200, orjson.dumps({"input_tokens": count}))

    return {
        ("POST", "/v1/messages"): messages,
        ("POST", "/v1/messages/count_tokens"): count_tokens,
    }
