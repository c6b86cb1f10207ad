"""The Gemini API, as the registry lists it."""

from __future__ import annotations

from polar.ir import Dialect
from polar.proxy.dialects.gemini.protocol import PATH_PREFIXES, GenerateContentRequest
from polar.proxy.dialects.gemini.translate import error_json, request_to_ir
from polar.proxy.dialects.spec import DialectSpec, Endpoint

DIALECT = DialectSpec(
    name=Dialect.GEMINI,
    # The path names the model and the method: /v1beta/models/{model}:{method}.
    endpoints=tuple(Endpoint("POST", prefix, prefix=True) for prefix in PATH_PREFIXES),
    routes="polar.proxy.dialects.gemini.routes",
    read_stored=lambda body, stream: request_to_ir(
        GenerateContentRequest.model_validate(body), stream=stream
    ),
    error_json=error_json,
)
