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

from polar.ir import ChatRequest, Completion, Dialect, TokenLogprob
from polar.proxy.asgi import ASGIApp, Receive, Scope, Send, headers_of, read_body, send_body
from polar.proxy.dialects.gemini.protocol import (
    KNOWN_EXTRAS,
    METHODS,
    PATH_PREFIXES,
    CountTokensRequest,
    GenerateContentRequest,
)
from polar.proxy.dialects.gemini.stream import ChunkEncoder
from polar.proxy.dialects.gemini.translate import (
    MODEL_PREFIX,
    error_json,
    request_to_ir,
    response_json,
)
from polar.proxy.errors import InvalidRequest, NotFound, ProxyError
from polar.proxy.gateway import Gateway
from polar.proxy.inbound import api_key_of, check_counts, json_object, validate
from polar.proxy.serving import internal, serve


def _response_id() -> str:
    return secrets.token_urlsafe(16)


class GeminiCodec:
    dialect = Dialect.GEMINI
    messages_field = "contents"

    def __init__(self, *, stream: bool) -> None:
        self._stream = stream

    def parse(self, body: dict[str, Any], gateway: Gateway) -> ChatRequest:
        wire = validate(GenerateContentRequest, body)
        if wire.model_extra:
            gateway.note_unknown_fields(self.dialect, set(wire.model_extra) - KNOWN_EXTRAS)
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
        return orjson.dumps(error_json(error))

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


def hot_prefixes(gateway: Gateway) -> dict[tuple[str, str], ASGIApp]:
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
            await _count_tokens(scope, receive, send, gateway, fields)
        else:
            codec = streamed if name == "streamGenerateContent" else unary
            await serve(scope, receive, send, codec, gateway, path_fields=fields)

    return {("POST", prefix): method for prefix in PATH_PREFIXES}


async def _count_tokens(
    scope: Scope, receive: Receive, send: Send, gateway: Gateway, fields: dict[str, str]
) -> None:
    codec = GeminiCodec(stream=False)
    headers = headers_of(scope)
    try:
        gateway.authenticate(api_key_of(scope["headers"], scope.get("query_string", b"")))
        raw = await read_body(
            receive, gateway.config.limits.max_body_bytes, headers.get("content-length")
        )
        body = json_object(raw, gateway.body_limits)
        body.update(fields)
        wire = validate(CountTokensRequest, body)
        if (wire.contents is None) == (wire.generateContentRequest is None):
            raise InvalidRequest("countTokens takes 'contents' or 'generateContentRequest'")
        given = wire.generateContentRequest
        inner = {**(given if given is not None else {"contents": body["contents"]}), **fields}
        check_counts(inner, gateway.body_limits, messages_field=codec.messages_field)
        count = await gateway.capture.count_tokens(codec.parse(inner, gateway))
    except ProxyError as error:
        await send_body(send, error.status, codec.error_body(error))
        return
    except Exception as error:
        await send_body(send, 500, codec.error_body(internal(codec, error)))
        return
    await send_body(send, 200, orjson.dumps({"totalTokens": count}))
