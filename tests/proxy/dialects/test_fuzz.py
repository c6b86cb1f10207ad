"""1,000 randomly mutated real requests per dialect against the running gateway.

The seeds are the golden requests recorded from the real CLIs. Each mutant has
one to three structural changes (a key dropped, a value replaced by one of
another type, an unknown ``type`` tag, a list element duplicated or removed) or
is broken as bytes (truncated, not UTF-8, not JSON). Whatever comes in: no 5xx,
every error is in the dialect's own shape, and the gateway still serves a
well-formed request afterwards. The scripted engine behind it answers any
request that reaches it (a cycling one-turn script).

Every case has a fixed seed (:data:`SEEDS`), named in any failure with the
mutant's index, so a CI failure replays exactly: ``mutants(dialect, n, seed)``.
Some values are hostile on purpose: nesting past every parser's comfort,
and strings of tens of kilobytes (hostile sizes have their own tests:
tests/proxy/test_ingress_limits.py).
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar.ir import Dialect

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "harness"
MUTANTS = 1000
PATHS = {
    Dialect.OPENAI_CHAT: "/v1/chat/completions",
    Dialect.ANTHROPIC_MESSAGES: "/v1/messages",
    Dialect.OPENAI_RESPONSES: "/v1/responses",
    Dialect.GEMINI: "/v1beta/models/policy:generateContent",
}
GEMINI_STREAM = "/v1beta/models/policy:streamGenerateContent?alt=sse"
ODD_VALUES: list[Any] = [
    None,
    True,
    0,
    -1,
    2**63,
    1e308,
    -0.5,
    "",
    "x" * 5000,
    "\u0000",
    [],
    [None],
    {},
    {"type": "hologram"},
    [{"type": "hologram"}],
    {"role": "wizard", "content": "hi"},
    "y" * 40_000,
    [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],
]
# Fixed per case: string hashing (``hash()``) changes with every process.
SEEDS = {
    (Dialect.OPENAI_CHAT, "engine_rendered"): 1101,
    (Dialect.OPENAI_CHAT, "token_in_token_out"): 1102,
    (Dialect.ANTHROPIC_MESSAGES, "engine_rendered"): 1103,
    (Dialect.ANTHROPIC_MESSAGES, "token_in_token_out"): 1104,
    (Dialect.OPENAI_RESPONSES, "engine_rendered"): 1105,
    (Dialect.OPENAI_RESPONSES, "token_in_token_out"): 1106,
    (Dialect.GEMINI, "engine_rendered"): 1107,
    (Dialect.GEMINI, "token_in_token_out"): 1108,
}


DEEP = "<a value nested deeper than the gateway accepts>"


def seeds(dialect: Dialect) -> list[dict[str, Any]]:
    out = []
    for path in sorted(FIXTURES.glob("*/*.json")):
        fixture = json.loads(path.read_text())
        if fixture["dialect"] == dialect.value:
            out.append(fixture["body"])
    return out


def nodes(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Paths of every value below the root (keys and list indices)."""
    if isinstance(value, dict):
        for key, child in value.items():
            yield (*path, key)
            yield from nodes(child, (*path, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield (*path, index)
            yield from nodes(child, (*path, index))


def mutate_once(body: Any, rng: random.Random) -> None:
    paths = list(nodes(body))
    if not paths:
        return
    path = rng.choice(paths)
    parent = body
    for step in path[:-1]:
        parent = parent[step]
    key = path[-1]
    value = parent[key]
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    choice = rng.random()
    if choice < 0.25:
        del parent[key]
    elif choice < 0.4 and (key == "type" or isinstance(value, str)):
        parent[key] = rng.choice(["hologram", "tool_use", "function_call", "", "TEXT"])
    elif choice < 0.5 and isinstance(parent, list):
        parent.insert(key, copy.deepcopy(value))
    elif choice < 0.6 and is_number:
        parent[key] = rng.choice([-value, value * 1000, str(value)])
    else:
        parent[key] = copy.deepcopy(rng.choice(ODD_VALUES))


def mutants(dialect: Dialect, count: int, seed: int) -> Iterator[bytes]:
    rng = random.Random(seed)
    bases = seeds(dialect)
    for _ in range(count):
        body = copy.deepcopy(rng.choice(bases))
        roll = rng.random()
        if roll < 0.9:
            for _ in range(rng.randint(1, 3)):
                mutate_once(body, rng)
            depth = rng.randint(60, 900) if rng.random() < 0.03 else 0
            if depth:
                body[rng.choice(["x_deep", "metadata", "tools"])] = DEEP
            if rng.random() < 0.5 and isinstance(body, dict):
                body["max_tokens" if dialect is Dialect.ANTHROPIC_MESSAGES else "stream"] = (
                    rng.choice([False, 16]) if dialect is not Dialect.ANTHROPIC_MESSAGES else 16
                )
            yield (
                json.dumps(body)
                .encode()
                .replace(json.dumps(DEEP).encode(), b"[" * depth + b"]" * depth)
            )
        elif roll < 0.94:
            raw = json.dumps(body).encode()
            yield raw[: rng.randrange(len(raw))]
        elif roll < 0.97:
            raw = bytearray(json.dumps(body).encode())
            raw[rng.randrange(len(raw))] = 0xFF
            yield bytes(raw)
        else:
            yield rng.choice([b"", b"null", b"[]", b"42", b'"text"', b"{"])


def check_error_shape(dialect: Dialect, reply: httpx.Response) -> None:
    body = reply.json()
    if dialect is Dialect.ANTHROPIC_MESSAGES:
        assert body["type"] == "error", body
        assert isinstance(body["error"]["type"], str) and body["error"]["message"], body
    elif dialect is Dialect.GEMINI:
        error = body["error"]
        assert set(error) == {"code", "message", "status"} and error["message"], body
        assert error["code"] == reply.status_code and isinstance(error["status"], str), body
    else:
        assert isinstance(body["error"]["message"], str) and body["error"]["message"], body
        assert "type" in body["error"], body


@pytest.mark.parametrize("capture", ["engine_rendered", "token_in_token_out"])
@pytest.mark.parametrize("dialect", list(PATHS), ids=lambda d: d.value)
def test_mutated_requests_never_get_a_5xx(make_stack: Any, dialect: Dialect, capture: str) -> None:
    stack = make_stack({"turns": [{"text": "ok"}], "cycle": True}, capture=capture)
    _, key = stack.new_session()
    headers = {
        "authorization": f"Bearer {key}",
        "x-api-key": key,
        "x-goog-api-key": key,
        "anthropic-version": "2023-06-01",
        "content-type": "application/json",
    }
    statuses: dict[int, int] = {}
    with httpx.Client(base_url=stack.url, headers=headers, timeout=60) as client:
        seed = SEEDS[(dialect, capture)]
        for index, raw in enumerate(mutants(dialect, MUTANTS // 2, seed=seed)):
            path = PATHS[dialect]
            if dialect is Dialect.GEMINI and index % 2:  # half of them streamed
                path = GEMINI_STREAM
            reply = client.post(path, content=raw)
            statuses[reply.status_code] = statuses.get(reply.status_code, 0) + 1
            assert reply.status_code < 500, (
                f"seed {seed}, mutant {index}",
                reply.status_code,
                reply.text[:500],
                raw[:300],
            )
            if reply.status_code >= 400:
                check_error_shape(dialect, reply)
        # Still serving: the first seed as sent, unmutated.
        reply = client.post(PATHS[dialect], json={**seeds(dialect)[0], "stream": False})
        assert reply.status_code == 200, reply.text
    # The mutants exercise both sides: many rejected, some served.
    rejected = sum(n for status, n in statuses.items() if status >= 400)
    assert statuses.get(200, 0) > 0 and rejected > 0, statuses
