"""The dashboard's HTTP surface over a real record store (no browser): who gets
in, what unknown ids and bad parameters get, and the headers every answer has."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from polar.dashboard import DashboardConfig
from polar.dashboard.app import CSP

from support.dashboard import TOKEN, Dashboard


@pytest.fixture
def http(dashboard: Dashboard) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=dashboard.url, headers={"authorization": f"Bearer {TOKEN}"}, timeout=60
    ) as client:
        yield client


@pytest.fixture
def anonymous(dashboard: Dashboard) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=dashboard.url, timeout=60) as client:
        yield client


PAGES = ["/", "/sessions", "/training", "/sessions/pi.token_in_token_out"]
API = [
    "/api/tasks",
    "/api/events",
    "/fragments/tasks",
    "/api/sessions/pi.token_in_token_out/traces/0/tokens",
]


@pytest.mark.parametrize("path", PAGES)
def test_pages_without_the_token_send_the_browser_to_the_login_form(
    anonymous: httpx.Client, path: str
) -> None:
    reply = anonymous.get(path)
    assert reply.status_code == 303
    assert reply.headers["location"] == "/login"


@pytest.mark.parametrize("path", API)
def test_the_api_without_the_token_is_401(anonymous: httpx.Client, path: str) -> None:
    reply = anonymous.get(path)
    assert reply.status_code == 401
    assert reply.json()["error"]["type"] == "unauthorized"
    wrong = anonymous.get(path, headers={"authorization": "Bearer not-the-token-at-all"})
    assert wrong.status_code == 401


def test_without_a_server_or_a_token_nothing_asks_for_one(
    recorded_store: Path, tokenizer: Any
) -> None:
    board = Dashboard(tokenizer, stores=(recorded_store,), control_token=None)
    try:
        with httpx.Client(base_url=board.url, timeout=60) as open_client:
            for path in [*PAGES, *API[2:]]:
                assert open_client.get(path).status_code == 200, path
            assert open_client.get("/login").headers["location"] == "/"
    finally:
        board.close()


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"server_url": "http://127.0.0.1:9"}, "a rollout server needs its control token"),
        ({"host": "0.0.0.0"}, "listening on 0.0.0.0 needs a control token"),
    ],
)
def test_a_server_or_a_public_address_needs_a_token(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        DashboardConfig(**config)


def test_the_login_form_refuses_a_query_with_400(anonymous: httpx.Client) -> None:
    reply = anonymous.get("/login?x=1")
    assert reply.status_code == 400
    assert "unknown query parameter" in reply.text


def test_the_login_form_sets_a_cookie_that_is_not_the_token(anonymous: httpx.Client) -> None:
    assert anonymous.post("/login", data={"token": "wrong-token-0123456789"}).status_code == 401
    assert anonymous.post("/login", content=b"token=%ff%fe").status_code == 401
    assert anonymous.post("/login", content=b"x" * 5000).status_code == 413
    reply = anonymous.post("/login", data={"token": TOKEN})
    assert reply.status_code == 303
    cookie = reply.headers["set-cookie"]
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie
    assert TOKEN not in cookie
    assert anonymous.get("/sessions").status_code == 200
    anonymous.post("/logout")
    assert anonymous.get("/sessions").status_code == 303


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/sessions/no-such-session", 404),
        ("/sessions/..%2F..%2Fetc", 404),
        ("/sessions/pi.token_in_token_out/traces/7", 404),
        ("/sessions/pi.token_in_token_out/traces/-1", 404),
        ("/sessions/pi.token_in_token_out/traces/x", 404),
        ("/no/such/page", 404),
        ("/sessions?x=1", 400),
        ("/?status=bogus", 400),
        ("/?status=running&status=completed", 400),
        ("/sessions/pi.token_in_token_out?trace=9", 400),
        ("/sessions/pi.token_in_token_out?trace=-1", 400),
        ("/sessions/pi.token_in_token_out/traces/0?offset=3", 400),
    ],
)
def test_unknown_ids_are_404_and_bad_parameters_400_as_pages(
    http: httpx.Client, path: str, status: int
) -> None:
    reply = http.get(path)
    assert reply.status_code == status
    assert reply.headers["content-type"].startswith("text/html")
    assert "Error" in reply.text


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/api/sessions/no-such-session/traces/0/tokens", 404),
        ("/api/sessions/pi.token_in_token_out/traces/3/tokens", 404),
        ("/api/sessions/pi.token_in_token_out/traces/0/tokens?limit=5", 400),
        ("/api/tasks", 404),  # this dashboard has no rollout server
        ("/api/nothing", 404),
    ],
)
def test_unknown_ids_are_404_and_bad_parameters_400_in_json(
    http: httpx.Client, path: str, status: int
) -> None:
    reply = http.get(path)
    assert reply.status_code == status
    assert reply.json()["error"]["message"]


def test_cancel_wants_the_dashboard_header(http: httpx.Client) -> None:
    """A cross-site form can send the cookie but not a header: refused first."""
    reply = http.post("/api/tasks/some-task/cancel")
    assert reply.status_code == 403
    assert "x-polar-dashboard" in reply.json()["error"]["message"]


def test_every_answer_forbids_inline_script_and_framing(
    http: httpx.Client, anonymous: httpx.Client
) -> None:
    for reply in (
        http.get("/sessions"),
        http.get("/api/sessions/pi.token_in_token_out/traces/0/tokens"),
        http.get("/nope"),
        anonymous.get("/login"),
        anonymous.get("/static/dashboard.js"),
    ):
        assert reply.headers["content-security-policy"] == CSP
        assert "'unsafe-inline'" not in CSP
        assert reply.headers["x-frame-options"] == "DENY"
        assert reply.headers["x-content-type-options"] == "nosniff"


def test_the_token_data_is_the_trace(http: httpx.Client) -> None:
    data = http.get("/api/sessions/pi.token_in_token_out/traces/0/tokens").json()
    assert data["total"] == len(data["ids"]) == len(data["text"]) == len(data["mask"])
    assert data["mask"][: data["prompt_tokens"]] == [0] * data["prompt_tokens"]
    assert sum(data["mask"]) == data["trained_tokens"] > 0
    assert all(
        (lp is None) == (i < data["prompt_tokens"] or not m)
        for i, (lp, m) in enumerate(zip(data["logprob"], data["mask"], strict=True))
    )
