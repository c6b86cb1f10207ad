"""The dialect registry is the one list of dialects: every dialect it lists is
served by the gateway's app at its endpoints, answered by the group's router in
its own error shape, and read back from its stored requests by the rollout
side; a dialect that is not Polar's, given to the app, is served the same way."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from starlette.testclient import TestClient

from polar.ir import (
    CaptureMode,
    CompletionRecord,
    Dialect,
    RecordStatus,
    Timings,
)
from polar.proxy.app import create_app
from polar.proxy.dialects.registry import DIALECTS, dialect_at, dialect_named
from polar.proxy.dialects.spec import DialectSpec, Endpoint
from polar.proxy.errors import AuthenticationFailed
from polar.proxy.workers.wire import error_reply
from polar.rollout.conversation import request_of

from support.dialects import PARSE
from support.toy_dialect import TOY, mount

GOLDEN = sorted((Path(__file__).resolve().parents[2] / "fixtures" / "harness").glob("*/*.json"))
UNDER_PREFIX = {
    "/v1beta/models/": "gemini-3.5-flash:generateContent",
    "/v1/models/": "gemini-3.5-flash:generateContent",
}
"""A call under each prefix endpoint (what the rest of the path names is the dialect's)."""
FORGED = AuthenticationFailed("unknown or closed session key")


def call_path(endpoint: Endpoint) -> str:
    return endpoint.path + UNDER_PREFIX[endpoint.path] if endpoint.prefix else endpoint.path


def test_every_dialect_is_registered_once() -> None:
    names = [spec.name for spec in DIALECTS]
    assert sorted(names) == sorted(Dialect)
    assert all(dialect_named(name).name is name for name in Dialect)
    endpoints = [(e.method, e.path) for spec in DIALECTS for e in spec.endpoints]
    assert len(endpoints) == len(set(endpoints))


def test_every_endpoint_is_served_with_its_dialects_errors(make_stack: Any) -> None:
    stack = make_stack({"turns": []})
    for spec in DIALECTS:
        for endpoint in spec.endpoints:
            path = call_path(endpoint)
            # A forged key: the dialect's handler refuses it before reading the body.
            reply = httpx.request(
                endpoint.method,
                f"{stack.url}{path}",
                json={},
                headers={"authorization": "Bearer sk-polar-forged"},
                timeout=30,
            )
            assert (reply.status_code, reply.json()) == (401, spec.error_json(FORGED)), path
            # The group's router answers in the same shape at the same path.
            assert dialect_at(path) is spec
            head, _, body = error_reply(path, FORGED).partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 401 ")
            assert body == spec.error_body(FORGED) == orjson.dumps(reply.json()), path


def test_errors_at_paths_no_dialect_serves_take_openais_shape() -> None:
    _, _, body = error_reply("/v1/nothing-here", FORGED).partition(b"\r\n\r\n")
    assert json.loads(body) == {
        "error": {
            "message": FORGED.message,
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }


@pytest.mark.parametrize("stream", [False, True])
def test_request_of_reads_every_dialects_stored_requests(stream: bool) -> None:
    seen = set()
    for path in GOLDEN:
        fixture = json.loads(path.read_text())
        dialect, body = Dialect(fixture["dialect"]), fixture["body"]
        record = CompletionRecord(
            session_id="s",
            seq=1,
            attempt=1,
            status=RecordStatus.COMPLETED,
            dialect=dialect,
            capture=CaptureMode.TOKEN_IN_TOKEN_OUT,
            engine="vllm",
            model="m",
            policy_version=0,
            stream=stream,
            original_request=body,
            engine_request={},
            timings=Timings(arrived=1.0, engine_started=1.0, first_token=1.0, finished=1.0),
        )
        request = request_of(record)
        assert request == dialect_named(dialect).read_stored(body, stream), path
        if stream:  # support.dialects reads Gemini's requests as streamed calls
            assert request == PARSE[dialect](body), path
        seen.add(dialect)
    assert seen == {spec.name for spec in DIALECTS}


def test_a_dialect_given_to_the_app_is_served(make_stack: Any) -> None:
    stack = make_stack({"turns": []})
    _, key = stack.new_session()
    # The gateway is already serving: this second app over it is never started.
    client = TestClient(create_app(stack.gateway, dialects=(*DIALECTS, TOY)))
    auth = {"authorization": f"Bearer {key}"}

    echo = client.post("/toy/echo", headers=auth)
    assert echo.status_code == 200 and echo.json()["toy"] == "/toy/echo"
    assert client.post("/toy/things/a/b", headers=auth).json()["toy"] == "/toy/things/a/b"
    forged = client.post("/toy/echo", headers={"authorization": "Bearer sk-polar-forged"})
    assert (forged.status_code, forged.json()) == (401, TOY.error_json(FORGED))
    # Under the toy's prefix even a method it does not serve is answered in its shape.
    wrong = client.get("/toy/things/a")
    assert wrong.status_code == 404 and set(wrong.json()) == {"toy_error"}
    # The registered dialects are still there.
    chat = client.post("/v1/chat/completions", json={}, headers={"authorization": "Bearer x"})
    assert (chat.status_code, chat.json()["error"]["code"]) == (401, "invalid_api_key")


def test_a_dialect_must_mount_exactly_its_endpoints(make_stack: Any) -> None:
    stack = make_stack({"turns": []})
    more = Endpoint("POST", "/toy/more")
    wider = DialectSpec(
        name=TOY.name,
        endpoints=(*TOY.endpoints, more),
        routes=TOY.routes,
        read_stored=TOY.read_stored,
        error_json=TOY.error_json,
    )
    assert set(mount(stack.gateway).hot) == set(TOY.endpoints)
    with pytest.raises(ValueError, match="/toy/more"):
        create_app(stack.gateway, dialects=(*DIALECTS, wider))
    with pytest.raises(ValueError, match="served by another dialect"):
        create_app(stack.gateway, dialects=(*DIALECTS, TOY, TOY))


def test_the_router_and_the_rollout_side_do_not_load_the_gateway() -> None:
    # The registry is imported by the group's router (a byte pump) and the rollout
    # side: a dialect's handlers load only when an app mounts them.
    code = (
        "import sys, polar.proxy.workers.wire, polar.rollout.conversation; "
        "print('polar.proxy.gateway' in sys.modules, "
        "any(m.endswith('.routes') for m in sys.modules if m.startswith('polar.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"], out.stderr
