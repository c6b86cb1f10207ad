"""``POST /v1/responses``."""

from __future__ import annotations

import time
from typing import Any

import orjson

from polar.ir import ChatRequest, Completion, Dialect, TokenLogprob
from polar.proxy.asgi import ASGIApp, Receive, Scope, Send
from polar.proxy.dialects.openai_errors import error_json
from polar.proxy.dialects.openai_responses.protocol import KNOWN_EXTRAS, ResponsesRequest
from polar.proxy.dialects.openai_responses.stream import EventEncoder
from polar.proxy.dialects.openai_responses.translate import (
    completion_output,
    final_status,
    new_id,
    request_to_ir,
    response_json,
)
from polar.proxy.errors import ProxyError
from polar.proxy.gateway import Gateway
from polar.proxy.inbound import validate
from polar.proxy.serving import serve


class ResponsesCodec:
    dialect = Dialect.OPENAI_RESPONSES
    messages_field = "input"

    def parse(self, body: dict[str, Any], gateway: Gateway) -> ChatRequest:
        wire = validate(ResponsesRequest, body)
        if wire.model_extra:
            gateway.note_unknown_fields(self.dialect, set(wire.model_extra) - KNOWN_EXTRAS)
        return request_to_ir(wire)

    def error_body(self, error: ProxyError) -> bytes:
        return orjson.dumps(error_json(error))

    def reply_body(
        self, request: ChatRequest, completion: Completion, details: list[TokenLogprob] | None
    ) -> bytes:
        return orjson.dumps(
            response_json(
                request,
                response_id=new_id("resp"),
                created_at=int(time.time()),
                status=final_status(completion.finish_reason),
                output=completion_output(completion, request),
                usage=completion.usage,
                finish=completion.finish_reason,
            )
        )

    def encoder(self, request: ChatRequest) -> EventEncoder:
        return EventEncoder(request, response_id=new_id("resp"))


def hot_routes(gateway: Gateway) -> dict[tuple[str, str], ASGIApp]:
    codec = ResponsesCodec()

    async def responses(scope: Scope, receive: Receive, send: Send) -> None:
        await serve(scope, receive, send, codec, gateway)

    return {("POST", "/v1/responses"): responses}
