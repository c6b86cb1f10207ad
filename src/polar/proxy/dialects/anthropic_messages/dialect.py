"""The Anthropic Messages dialect, as the registry lists it."""

from __future__ import annotations

from polar.ir import Dialect
from polar.proxy.dialects.anthropic_messages.protocol import MessagesRequest
from polar.proxy.dialects.anthropic_messages.translate import error_json, request_to_ir
from polar.proxy.dialects.spec import DialectSpec, Endpoint

MESSAGES = Endpoint("POST", "/v1/messages")
"""``?beta=true`` too (the query is not part of the path)."""
COUNT_TOKENS = Endpoint("POST", "/v1/messages/count_tokens")

DIALECT = DialectSpec(
    name=Dialect.ANTHROPIC_MESSAGES,
    endpoints=(MESSAGES, COUNT_TOKENS),
    routes="polar.proxy.dialects.anthropic_messages.routes",
    read_stored=lambda body, _stream: request_to_ir(MessagesRequest.model_validate(body)),
    error_json=error_json,
)
