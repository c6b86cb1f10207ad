"""``POST /v1/chat/completions`` (hot path, plain ASGI) and ``GET /v1/models``."""

from __future__ import annotations

import secrets
import time
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from polar.ir import ChatRequest, Completion, TokenLogprob
from polar.proxy.call.serving import serve
from polar.proxy.dialects import handlers
from polar.proxy.dialects.openai_chat.dialect import CHAT_COMPLETIONS, DIALECT
from polar.proxy.dialects.openai_chat.protocol import IGNORED_FIELDS, ChatCompletionRequest
from polar.proxy.dialects.openai_chat.stream import ChunkEncoder
from polar.proxy.dialects.openai_chat.translate import completion_json, logprobs_json, request_to_ir
from polar.proxy.dialects.spec import Mounted
from polar.proxy.errors import ProxyError
from polar.proxy.front.asgi import Receive, Scope, Send
from polar.proxy.front.inbound import api_key_of
from polar.proxy.gateway import Gateway


class OpenAIChatCodec:
    dialect = DIALECT.name
    messages_field = "messages"

    def __init__(self, reasoning_field: str) -> None:
        self._reasoning_field = None if reasoning_field == "none" else reasoning_field

    def parse(self, body: dict[str, Any], gateway: Gateway) -> ChatRequest:
        wire = handlers.read_wire(ChatCompletionRequest, body, gateway, self, IGNORED_FIELDS)
        return request_to_ir(wire)

    def error_body(self, error: ProxyError) -> bytes:
        return DIALECT.error_body(error)

    def reply_body(
        self, request: ChatRequest, completion: Completion, details: list[TokenLogprob] | None
    ) -> bytes:
        return orjson.dumps(
            completion_json(
                completion,
                response_id=_response_id(),
                created=int(time.time()),
                model=request.model,
                reasoning_field=self._reasoning_field,
                logprobs=(
                    logprobs_json(tuple(details), request.top_logprobs or 0)
                    if details is not None
                    else None
                ),
            )
        )

    def encoder(self, request: ChatRequest) -> ChunkEncoder:
        return ChunkEncoder(
            response_id=_response_id(),
            created=int(time.time()),
            model=request.model,
            reasoning_field=self._reasoning_field,
            top_logprobs=request.top_logprobs,
            include_usage=request.include_usage,
        )


def _response_id() -> str:
    return f"chatcmpl-{secrets.token_hex(12)}"


def mount(gateway: Gateway) -> Mounted:
    codec = OpenAIChatCodec(gateway.config.dialects.openai_chat.reasoning_field)

    async def chat_completions(scope: Scope, receive: Receive, send: Send) -> None:
        await serve(scope, receive, send, codec, gateway)

    async def models(request: Request) -> Response:
        try:
            gateway.authenticate(api_key_of(request.headers.raw))
        except ProxyError as error:
            return Response(
                DIALECT.error_body(error), status_code=error.status, media_type="application/json"
            )
        body = {
            "object": "list",
            "data": [
                {"id": gateway.capture.model, "object": "model", "created": 0, "owned_by": "polar"}
            ],
        }
        return Response(orjson.dumps(body), media_type="application/json")

    return Mounted(
        hot={CHAT_COMPLETIONS: chat_completions},
        routes=[Route("/v1/models", models, methods=["GET"])],
    )
