"""``POST /v1/responses``."""

from __future__ import annotations

import time
from typing import Any

import orjson

from polar.ir import ChatRequest, Completion, TokenLogprob
from polar.proxy.call.serving import serve
from polar.proxy.dialects import handlers
from polar.proxy.dialects.openai_responses.dialect import DIALECT, RESPONSES
from polar.proxy.dialects.openai_responses.protocol import KNOWN_EXTRAS, ResponsesRequest
from polar.proxy.dialects.openai_responses.stream import EventEncoder
from polar.proxy.dialects.openai_responses.translate import (
    completion_output,
    final_status,
    new_id,
    request_to_ir,
    response_json,
)
from polar.proxy.dialects.spec import Mounted
from polar.proxy.errors import ProxyError
from polar.proxy.front.asgi import Receive, Scope, Send
from polar.proxy.gateway import Gateway


class ResponsesCodec:
    dialect = DIALECT.name
    messages_field = "input"

    def parse(self, body: dict[str, Any], gateway: Gateway) -> ChatRequest:
        return request_to_ir(
            handlers.read_wire(ResponsesRequest, body, gateway, self, KNOWN_EXTRAS)
        )

    def error_body(self, error: ProxyError) -> bytes:
        return DIALECT.error_body(error)

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


def mount(gateway: Gateway) -> Mounted:
    codec = ResponsesCodec()

    async def responses(scope: Scope, receive: Receive, send: Send) -> None:
        await serve(scope, receive, send, codec, gateway)

    return Mounted(hot={RESPONSES: responses})
