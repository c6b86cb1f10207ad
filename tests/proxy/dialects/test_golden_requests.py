"""Requests recorded from the real CLIs (``tests/fixtures/harness``, written by
``tests/fixtures/harness/capture.py``) go to the IR and back without loss, and
what the IR holds in typed fields is what the CLI sent: every tool call with its
arguments, every tool result, the user's instruction in the rendered prompt."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from polar.ir import ChatRequest, Dialect, Role, ToolCall
from polar.proxy.dialects.anthropic_messages import translate as anthropic
from polar.proxy.dialects.gemini import translate as gemini
from polar.proxy.dialects.openai_chat import translate as chat
from polar.proxy.dialects.openai_responses import translate as responses
from polar.proxy.render.template import ChatTemplate

from support.dialects import PARSE

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "harness"
GOLDEN = sorted(FIXTURES.glob("*/*.json"))
INSTRUCTION = "Write the word polar into proof.txt using the shell."

REBUILD: dict[Dialect, Callable[[ChatRequest], dict[str, Any]]] = {
    Dialect.OPENAI_CHAT: chat.request_from_ir,
    Dialect.ANTHROPIC_MESSAGES: anthropic.request_from_ir,
    Dialect.OPENAI_RESPONSES: responses.request_from_ir,
    Dialect.GEMINI: gemini.request_from_ir,
}


def load(path: Path) -> tuple[Dialect, dict[str, Any]]:
    fixture = json.loads(path.read_text())
    return Dialect(fixture["dialect"]), fixture["body"]


def fixture_id(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


def wire_tool_traffic(dialect: Dialect, body: dict[str, Any]) -> tuple[list[Any], list[str]]:
    """(name, parsed arguments) of every tool call and the text of every tool
    result, read straight off the wire body."""
    calls: list[Any] = []
    results: list[str] = []
    if dialect is Dialect.OPENAI_CHAT:
        for message in body["messages"]:
            for call in message.get("tool_calls") or ():
                function = call["function"]
                calls.append((function["name"], json.loads(function["arguments"])))
            if message["role"] == "tool":
                content = message["content"]
                results.append(
                    content if isinstance(content, str) else "".join(p["text"] for p in content)
                )
    elif dialect is Dialect.ANTHROPIC_MESSAGES:
        for message in body["messages"]:
            for block in message["content"] if isinstance(message["content"], list) else ():
                if block["type"] == "tool_use":
                    calls.append((block["name"], block["input"]))
                elif block["type"] == "tool_result":
                    content = block.get("content", "")
                    results.append(
                        content
                        if isinstance(content, str)
                        else "".join(b.get("text", "") for b in content)
                    )
    elif dialect is Dialect.GEMINI:
        for content in body["contents"]:
            for part in content["parts"]:
                if "functionCall" in part:
                    calls.append((part["functionCall"]["name"], part["functionCall"]["args"]))
                elif "functionResponse" in part:
                    response = part["functionResponse"]["response"]
                    results.append(
                        response["output"] if list(response) == ["output"] else json.dumps(response)
                    )
    else:
        for item in body["input"] if isinstance(body["input"], list) else ():
            if item.get("type") == "function_call":
                calls.append((item["name"], json.loads(item["arguments"])))
            elif item.get("type") == "function_call_output":
                output = item["output"]
                results.append(
                    output if isinstance(output, str) else "".join(p["text"] for p in output)
                )
    return calls, results


def ir_tool_traffic(request: ChatRequest) -> tuple[list[Any], list[str]]:
    calls = [
        (part.name, json.loads(part.arguments))
        for message in request.messages
        for part in message.parts
        if isinstance(part, ToolCall)
    ]
    results = [m.text for m in request.messages if m.role is Role.TOOL]
    return calls, results


def test_every_cli_has_golden_requests() -> None:
    harnesses = {path.parent.name for path in GOLDEN}
    assert harnesses == {
        "codex",
        "claude_code",
        "qwen_code",
        "pi",
        "opencode",
        "mini_swe_agent",
        "gemini_cli",
    }
    dialects = {load(path)[0] for path in GOLDEN}
    assert dialects == set(Dialect)


@pytest.mark.parametrize("path", GOLDEN, ids=fixture_id)
def test_request_goes_to_the_ir_and_back_without_loss(path: Path) -> None:
    dialect, body = load(path)
    request = PARSE[dialect](body)
    # JSON equality: every key and value, in every list in order (object key
    # order is not part of JSON's meaning).
    assert REBUILD[dialect](request) == body


@pytest.mark.parametrize("path", GOLDEN, ids=fixture_id)
def test_typed_fields_hold_what_the_cli_sent(path: Path, tokenizer: Any) -> None:
    dialect, body = load(path)
    request = PARSE[dialect](body)
    assert ir_tool_traffic(request) == wire_tool_traffic(dialect, body)
    prompt_ids, prompt_text = ChatTemplate(tokenizer).render(
        request.messages, request.tools, kwargs={}
    )
    assert prompt_ids
    title_call = path.parent.name == "opencode" and "title generator" in prompt_text
    if not title_call:
        assert INSTRUCTION in prompt_text
    for tool in request.tools:
        assert f'"name": "{tool.name}"' in prompt_text
