"""A wire request body of any dialect to the IR, as the gateway reads it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from polar.ir import ChatRequest, Dialect
from polar.proxy.dialects.anthropic_messages import translate as anthropic
from polar.proxy.dialects.anthropic_messages.protocol import MessagesRequest
from polar.proxy.dialects.gemini import translate as gemini
from polar.proxy.dialects.gemini.protocol import GenerateContentRequest
from polar.proxy.dialects.openai_chat import translate as chat
from polar.proxy.dialects.openai_chat.protocol import ChatCompletionRequest
from polar.proxy.dialects.openai_responses import translate as responses
from polar.proxy.dialects.openai_responses.protocol import ResponsesRequest

Parse = Callable[[dict[str, Any]], ChatRequest]
PARSE: dict[Dialect, Parse] = {
    Dialect.OPENAI_CHAT: lambda b: chat.request_to_ir(ChatCompletionRequest.model_validate(b)),
    Dialect.ANTHROPIC_MESSAGES: lambda b: anthropic.request_to_ir(
        MessagesRequest.model_validate(b)
    ),
    Dialect.OPENAI_RESPONSES: lambda b: responses.request_to_ir(ResponsesRequest.model_validate(b)),
    Dialect.GEMINI: lambda b: gemini.request_to_ir(
        GenerateContentRequest.model_validate(b), stream=True
    ),
}
