"""The OpenAI Chat Completions dialect, as the registry lists it."""

from __future__ import annotations

from polar.ir import Dialect
from polar.proxy.dialects.openai_chat.protocol import ChatCompletionRequest
from polar.proxy.dialects.openai_chat.translate import request_to_ir
from polar.proxy.dialects.openai_errors import error_json
from polar.proxy.dialects.spec import DialectSpec, Endpoint

CHAT_COMPLETIONS = Endpoint("POST", "/v1/chat/completions")

DIALECT = DialectSpec(
    name=Dialect.OPENAI_CHAT,
    endpoints=(CHAT_COMPLETIONS,),  # and GET /v1/models, on the Starlette app
    routes="polar.proxy.dialects.openai_chat.routes",
    read_stored=lambda body, _stream: request_to_ir(ChatCompletionRequest.model_validate(body)),
    error_json=error_json,
)
