"""``POST /v1beta/models/{model}:generateContent``, ``:streamGenerateContent?alt=sse``
and ``:countTokens`` (``/v1/models/...`` too).

The path names the model: it is recorded as the request's ``model`` field
(``models/{model}``), whatever engine model serves the call, so a CLI that asks
for different models (the Gemini CLI's routing classifier and its agent turns)
is served by the one engine and its records say what it asked. The key comes as
``x-goog-api-key`` or ``?key=`` (or any header the other dialects use).
"""

from __future__ import annotations

import secrets
from typing import Any
from urllib.parse import parse_qs

import orjson

from polar.ir import ChatRequest, Completion, TokenLogprob
from polar.proxy.call.serving import serve
from polar.proxy.dialects import handlers
from polar.proxy.dialects.gemini.dialect import DIALECT
from polar.proxy.dialects.gemini.protocol import (
    KNOWN_EXTRAS,
    METHODS,
    PATH_PREFIXES,
    CountTokensRequest,
    GenerateContentRequest,
)
from polar.proxy.dialects.gemini.stream import ChunkEncoder
from polar.proxy.dialects.gemini.translate import MODEL_PREFIX, request_to_ir, response_json
from polar.proxy.dialects.spec import Mounted
from polar.proxy.errors import InvalidRequest, NotFound, ProxyError
from polar.proxy.front.asgi import Receive, Scope, Send, send_body
from polar.proxy.front.inbound import check_counts, validate
from polar.proxy.gateway import Gateway


def _response_id() -> str:
    return secrets.token_urlsafe(16)


class GeminiCodec:
    dialect = DIALECT.name
    messages_field = "contents"

    def __init__(self, *, stream: bool) -> None:
        self._stream = stream

    def parse(self, body: dict[str, Any], gateway: Gateway) -> ChatRequest:
        wire = handlers.read_wire(GenerateContentRequest, body, gateway, self, KNOWN_EXTRAS)
        declarations = sum(len(t.functionDeclarations or ()) for t in wire.tools or ())
        most = gateway.body_limits.tools
        if declarations > most:
            raise InvalidRequest(
                f"tools: {declarations} function declarations, more than this gateway "
                f"accepts ({most}; limits.max_tools)",
                param="tools",
            )
        return request_to_ir(wire, stream=self._stream)

    def error_body(self, error: ProxyError) -> bytes:
        return DIALECT.error_body(error)

    def reply_body(
        self, request: ChatRequest, completion: Completion, details: list[TokenLogprob] | None
    ) -> bytes:
        return orjson.dumps(
            response_json(
                completion,
                request,
                response_id=_response_id(),
                details=tuple(details) if details is not None else None,
            )
        )

    def encoder(self, request: ChatRequest) -> ChunkEncoder:
        return ChunkEncoder(request, response_id=_response_id())


def split_path(path: str) -> tuple[str, str]:
    """``/v1beta/models/{model}:{method}`` -> (model, method); NotFound otherwise."""
    prefix = next((p for p in PATH_PREFIXES if path.startswith(p)), None)
    model, colon, method = path[len(prefix or "") :].rpartition(":")
    if prefix is None or not colon or method not in METHODS:
        raise NotFound(
            f"{path[:200]}: not a Gemini API method (POST {PATH_PREFIXES[0]}{{model}}:"
            f"{'|'.join(METHODS)})"
        )
    if not model or "/" in model or len(model) > 256:
        raise NotFound(f"{path[:200]}: not a model name")
    return model, method


def mount(gateway: Gateway) -> Mounted:
    unary, streamed = GeminiCodec(stream=False), GeminiCodec(stream=True)

    async def method(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            model, name = split_path(scope["path"])
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            if name == "streamGenerateContent" and query.get("alt") != ["sse"]:
                raise InvalidRequest(
                    "streamGenerateContent is served as server-sent events only: add ?alt=sse",
                    param="alt",
                )
        except ProxyError as error:
            await send_body(send, error.status, unary.error_body(error))
            return
        fields = {"model": MODEL_PREFIX + model}
        if name == "countTokens":
            await handlers.count_tokens(
                scope,
                receive,
                send,
                unary,
                gateway,
                request_of=lambda body: _count_request(body, fields, unary, gateway),
                reply=lambda count: {"totalTokens": count},
                key_in_query=True,
            )
        else:
            codec = streamed if name == "streamGenerateContent" else unary
            await serve(scope, receive, send, codec, gateway, path_fields=fields)

    return Mounted(hot=dict.fromkeys(DIALECT.endpoints, method))


def _count_request(
    body: dict[str, Any], fields: dict[str, str], codec: GeminiCodec, gateway: Gateway
) -> ChatRequest:
    body.update(fields)
    wire = validate(CountTokensRequest, body)
    if (wire.contents is None) == (wire.generateContentRequest is None):
        raise InvalidRequest("countTokens takes 'contents' or 'generateContentRequest'")
    given = wire.generateContentRequest
    inner = {**(given if given is not None else {"contents": body["contents"]}), **fields}
    check_counts(inner, gateway.body_limits, messages_field=codec.messages_field)
    return codec.parse(inner, gateway)
