"""Per-session scripts: one scripted engine serving several gateway sessions at
once, each session following its own script (keyed by the session header the
gateway puts on every engine request)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from polar.testing.scripted import SESSION_HEADER, ScriptError, script_from_dict


def session_script(word: str) -> dict[str, Any]:
    return {
        "turns": [
            {"text": f"{word} one", "expect": {"last_text_contains": "first"}},
            {"text": f"{word} two", "expect": {"last_text_contains": "second"}},
        ]
    }


@pytest.mark.parametrize("capture", ["engine_rendered", "token_in_token_out"])
def test_concurrent_sessions_each_follow_their_own_script(make_stack: Any, capture: str) -> None:
    scripts = {"sessions": [session_script("alpha"), session_script("beta")]}
    if capture == "token_in_token_out":
        for script in scripts["sessions"]:
            for turn, word in zip(script["turns"], ("first", "second"), strict=True):
                turn["expect"] = {"prompt_contains": word}
    stack = make_stack(scripts, capture=capture)
    sessions = [stack.new_session() for _ in range(2)]

    async def converse(key: str) -> list[str]:
        async with AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=key, max_retries=0) as client:
            history: list[dict[str, str]] = []
            said = []
            for word in ("first", "second"):
                history.append({"role": "user", "content": f"the {word} question"})
                reply = await client.chat.completions.create(
                    model="m",
                    messages=history,  # type: ignore[arg-type]
                )
                text = reply.choices[0].message.content or ""
                said.append(text.split("</think>")[-1].strip())
                history.append({"role": "assistant", "content": text})
            return said

    async def both() -> list[list[str]]:
        return list(await asyncio.gather(*(converse(key) for _, key in sessions)))

    answers = asyncio.run(both())
    stack.engine.assert_clean()
    assignments = stack.engine.assignments
    assert sorted(assignments) == sorted(sid for sid, _ in sessions)
    for (sid, _), said in zip(sessions, answers, strict=True):
        word = ("alpha", "beta")[assignments[sid]]
        assert said == [f"{word} one", f"{word} two"]
        # Each record names its own session's script output.
        records = stack.records(sid)
        assert [r.seq for r in records] == [1, 2]


def test_the_gateway_names_the_session_on_its_engine_requests(make_stack: Any) -> None:
    stack = make_stack({"sessions": [{"turns": [{"text": "hi"}]}]})
    sid, key = stack.new_session()
    with stack.client(key) as client:
        reply = client.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hello"}]},
        )
    assert reply.status_code == 200, reply.text
    assert stack.engine.assignments == {sid: 0}


def test_a_request_without_the_session_header_is_a_mismatch(make_stack: Any) -> None:
    stack = make_stack({"sessions": [{"turns": [{"text": "hi"}]}]})
    reply = httpx.post(
        f"{stack.engine.url}/v1/chat/completions",
        json={"model": "scripted", "messages": [{"role": "user", "content": "x"}]},
    )
    assert reply.status_code == 500
    assert SESSION_HEADER in reply.json()["error"]["message"]
    assert stack.engine.failures


def test_more_sessions_than_scripts_is_a_mismatch(make_stack: Any) -> None:
    stack = make_stack({"sessions": [{"turns": [{"text": "hi"}]}]})
    for expected in (200, 502):
        _, key = stack.new_session()
        with stack.client(key) as client:
            reply = client.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
            )
        assert reply.status_code == expected, reply.text
    assert "only 1 such session scripts" in stack.engine.failures[0]


def test_a_session_takes_the_script_its_id_matches_and_the_rest_go_in_order(
    make_stack: Any,
) -> None:
    """Patterned scripts make a session's model depend on who it is, not on when
    it arrived: ``.a1-`` sessions always get "one", however many there are."""
    stack = make_stack(
        {
            "sessions": [
                {"turns": [{"text": "in order"}]},
                {"session": r"\.a1-", "turns": [{"text": "one"}]},
                {"session": r"\.a2-", "turns": [{"text": "two"}]},
            ]
        }
    )

    def ask(session_id: str) -> str:
        with stack.admin() as admin:
            created = admin.post("/admin/sessions", json={"session_id": session_id})
        created.raise_for_status()
        with stack.client(created.json()["api_key"]) as client:
            reply = client.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
            )
        assert reply.status_code == 200, reply.text
        text: str = reply.json()["choices"][0]["message"]["content"]
        return text.split("</think>")[-1].strip()

    assert ask("job.a2-s0") == "two"
    assert ask("job.a1-s0") == "one"
    assert ask("again.a1-s0") == "one"
    assert ask("other-s0") == "in order"
    stack.engine.assert_clean()
    assert stack.engine.assignments == {
        "job.a2-s0": 2,
        "job.a1-s0": 1,
        "again.a1-s0": 1,
        "other-s0": 0,
    }


def test_a_patterned_script_left_unused_counts_as_unused_turns(make_stack: Any) -> None:
    stack = make_stack({"sessions": [{"session": "never", "turns": [{"text": "x"}]}]})
    with pytest.raises(AssertionError, match="1 unused turns"):
        stack.engine.assert_clean()


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"sessions": []}, "'sessions' is empty"),
        ({"sessions": [{"turns": "x"}]}, "sessions[0]"),
        ({"sessions": [], "cycle": True}, "unknown fields"),
        ({"sessions": [{"session": "(", "turns": []}]}, "not a regular expression"),
        ({"sessions": [{"session": 3, "turns": []}]}, "expected a regular expression"),
    ],
)
def test_bad_session_scripts_are_rejected(data: dict[str, Any], needle: str) -> None:
    with pytest.raises(ScriptError, match=needle.replace("[", r"\[")):
        script_from_dict(data)
