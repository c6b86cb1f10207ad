"""What the dialects' handlers do the same way, beyond :func:`polar.proxy.call.serving.serve`:
read a request body against the dialect's wire model, and answer a token count.
"""

from __future__ import annotations

from collections.abc import Callable, Set
from typing import Any, TypeVar

import orjson
import pydantic

from polar.ir import ChatRequest
from polar.proxy.call.serving import DialectCodec, internal
from polar.proxy.errors import ProxyError
from polar.proxy.front.asgi import Receive, Scope, Send, headers_of, read_body, send_body
from polar.proxy.front.inbound import api_key_of, json_object, validate
from polar.proxy.gateway import Gateway

W = TypeVar("W", bound=pydantic.BaseModel)


def read_wire(
    model: type[W], body: dict[str, Any], gateway: Gateway, codec: DialectCodec, known: Set[str]
) -> W:
    """The body as the dialect's wire model (a 400 naming the first problem);
    top-level fields the model does not declare and ``known`` does not list are
    counted on the gateway (``note_unknown_fields``), to show what a harness sends."""
    wire = validate(model, body)
    if wire.model_extra:
        gateway.note_unknown_fields(codec.dialect, set(wire.model_extra) - known)
    return wire


async def count_tokens(
    scope: Scope,
    receive: Receive,
    send: Send,
    codec: DialectCodec,
    gateway: Gateway,
    *,
    request_of: Callable[[dict[str, Any]], ChatRequest],
    reply: Callable[[int], dict[str, Any]],
    key_in_query: bool,
) -> None:
    """A count-tokens call: authenticate, read the JSON body, ``request_of`` it
    (the dialect's checks and translation), count the prompt the engine would
    see, ``reply`` with the count; any error in the dialect's shape."""
    query = scope.get("query_string", b"") if key_in_query else b""
    try:
        gateway.authenticate(api_key_of(scope["headers"], query))
        raw = await read_body(
            receive, gateway.config.limits.max_body_bytes, headers_of(scope).get("content-length")
        )
        request = request_of(json_object(raw, gateway.body_limits))
        count = await gateway.capture.count_tokens(request)
    except ProxyError as error:
        await send_body(send, error.status, codec.error_body(error))
        return
    except Exception as error:
        await send_body(send, 500, codec.error_body(internal(codec, error)))
        return
    await send_body(send, 200, orjson.dumps(reply(count)))
