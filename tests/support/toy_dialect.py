"""A dialect that is not one of Polar's, to show that one package and a spec
are all a dialect takes: ``POST /toy/echo`` answers what the session key is
worth, everything under ``/toy/things/`` is the toy's (errors in its shape).

Records name their dialect with :class:`polar.ir.Dialect`; the toy records
nothing, so it borrows a member.
"""

from __future__ import annotations

from typing import Any

import orjson

from polar.ir import Dialect
from polar.proxy.dialects.spec import DialectSpec, Endpoint, Mounted
from polar.proxy.errors import ProxyError
from polar.proxy.front.asgi import Receive, Scope, Send, send_body
from polar.proxy.front.inbound import api_key_of
from polar.proxy.gateway import Gateway

ECHO = Endpoint("POST", "/toy/echo")
THINGS = Endpoint("POST", "/toy/things/", prefix=True)


def error_json(error: ProxyError) -> dict[str, Any]:
    return {"toy_error": {"status": error.status, "text": error.message}}


def mount(gateway: Gateway) -> Mounted:
    async def echo(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            session = gateway.authenticate(api_key_of(scope["headers"]))
        except ProxyError as error:
            await send_body(send, error.status, TOY.error_body(error))
            return
        await send_body(send, 200, orjson.dumps({"toy": scope["path"], "session": session.id}))

    return Mounted(hot={ECHO: echo, THINGS: echo})


def _read_stored(body: dict[str, Any], stream: bool) -> Any:
    raise NotImplementedError("the toy records nothing")


TOY = DialectSpec(
    name=Dialect.OPENAI_CHAT,
    endpoints=(ECHO, THINGS),
    routes=__name__,
    read_stored=_read_stored,
    error_json=error_json,
)
