"""The OpenAI Responses dialect, as the registry lists it."""

from __future__ import annotations

from polar.ir import Dialect
from polar.proxy.dialects.openai_errors import error_json
from polar.proxy.dialects.openai_responses.protocol import ResponsesRequest
from polar.proxy.dialects.openai_responses.translate import request_to_ir
from polar.proxy.dialects.spec import DialectSpec, Endpoint

RESPONSES = Endpoint("POST", "/v1/responses")

DIALECT = DialectSpec(
    name=Dialect.OPENAI_RESPONSES,
    endpoints=(RESPONSES,),
    routes="polar.proxy.dialects.openai_responses.routes",
    read_stored=lambda body, _stream: request_to_ir(ResponsesRequest.model_validate(body)),
    error_json=error_json,
)
