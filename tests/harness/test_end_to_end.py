"""The real agent CLIs, unmodified, against the real gateway and the scripted
engine, in both capture modes: codex (OpenAI Responses), claude_code (Anthropic
Messages), qwen_code, pi, opencode and mini_swe_agent (Chat Completions),
gemini_cli (the Gemini API).

Each CLI runs headless in a fresh HOME and workdir (installed by the test set-up
from npm/PyPI at the presets' pinned versions). The scripted model thinks, then
asks for the CLI's own shell tool with a command that writes a file; the CLI
runs it and sends the result back; the second scripted turn ends the run. The
test checks the file, that every call is recorded with ids and the engine's
logprobs, and that the recorded output ids decode to exactly what the CLI
received: the CLI replays the assistant turn (reasoning, tool call) in its next
request and prints the final answer. Nothing here may reach the internet: the
presets switch off every lookup.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from polar.harness import Harness, RunSpec, load_harness, run_harness
from polar.harness.exchange import MINI_SWE_AGENT_DONE, SHELL_EXCHANGES
from polar.ir import CompletionRecord, Dialect, PromptOrigin, RecordStatus
from polar.testing.scripted.vllm_wire import logprob_for

COMMAND = "echo polar > proof.txt"
REASONING = "I will write the file with the shell tool."
FINAL = "Wrote proof.txt."
MINI_DONE = MINI_SWE_AGENT_DONE
EOT = "<|im_end|>"
CAPTURES = ["engine_rendered", "token_in_token_out"]


@dataclass(frozen=True)
class Case:
    harness: str
    first_last_role: str = "user"
    """Role of the first request's last message, as the engine sees it."""
    title_call: bool = False
    """opencode asks for a session title before it starts."""
    classifier: bool = False
    """The Gemini CLI on its ``auto`` model asks a routing classifier first."""
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def shell_tool(self) -> str:
        return SHELL_EXCHANGES[self.harness].tool

    @property
    def argument(self) -> str:
        return SHELL_EXCHANGES[self.harness].argument

    @property
    def ends_with_a_command(self) -> bool:
        # mini-swe-agent ends a run only when a command prints its marker first.
        return SHELL_EXCHANGES[self.harness].done_command is not None


CASES = {
    "codex": Case("codex"),
    # Claude Code appends a system item (its agent list) after the instruction.
    "claude_code": Case("claude_code", first_last_role="system"),
    "qwen_code": Case("qwen_code"),
    "pi": Case("pi"),
    "opencode": Case("opencode", title_call=True),
    "mini_swe_agent": Case("mini_swe_agent"),
    "gemini_cli": Case("gemini_cli"),
}
CLASSIFIER = '{"complexity_reasoning": "One explicit command.", "complexity_score": 15}'


def script_for(case: Case, capture: str) -> dict[str, Any]:
    chat = capture == "engine_rendered"
    first = (
        {"tools_include": [case.shell_tool], "last_role": case.first_last_role}
        if chat
        else {"prompt_contains": f'"name": "{case.shell_tool}"'}
    )
    second = (
        {"last_role": "tool", "tools_include": [case.shell_tool]}
        if chat
        else {"prompt_contains": "<tool_response>"}
    )
    final: dict[str, Any] = (
        {"tool_calls": [{"name": case.shell_tool, "arguments": {case.argument: MINI_DONE}}]}
        if case.ends_with_a_command
        else {"text": FINAL}
    )
    script: dict[str, Any] = {
        "turns": [
            {
                "reasoning": REASONING,
                "tool_calls": [{"name": case.shell_tool, "arguments": {case.argument: COMMAND}}],
                "expect": first,
            },
            {**final, "expect": second},
        ]
    }
    if case.title_call:
        when = (
            {"system_contains": "title generator"}
            if chat
            else {"prompt_contains": "You are a title generator"}
        )
        script["side"] = [{"when": when, "text": "Writing proof.txt"}]
    if case.classifier:
        when = (
            {"system_contains": "Task Routing AI"}
            if chat
            else {"prompt_contains": "You are a specialized Task Routing AI"}
        )
        script["side"] = [{"when": when, "text": CLASSIFIER}]
    return script


@dataclass(frozen=True)
class Replayed:
    """The assistant turn as the CLI sent it back in its next request."""

    reasoning: str | None
    name: str
    arguments: dict[str, Any]
    raw_arguments: str | None
    """The argument text, where the dialect carries it as text."""


def replayed_turn(dialect: Dialect, body: dict[str, Any]) -> Replayed:
    if dialect is Dialect.OPENAI_RESPONSES:
        items = body["input"]
        reasoning = next((i for i in items if i.get("type") == "reasoning"), None)
        call = next(i for i in items if i.get("type") == "function_call")
        return Replayed(
            "".join(p["text"] for p in reasoning["content"]) if reasoning else None,
            call["name"],
            json.loads(call["arguments"]),
            call["arguments"],
        )
    if dialect is Dialect.GEMINI:
        model = [c for c in body["contents"] if c.get("role") == "model"][-1]
        thoughts = [p["text"] for p in model["parts"] if p.get("thought")]
        function = next(p["functionCall"] for p in model["parts"] if "functionCall" in p)
        return Replayed(
            "".join(thoughts) if thoughts else None, function["name"], function["args"], None
        )
    assistant = [m for m in body["messages"] if m["role"] == "assistant"][-1]
    if dialect is Dialect.ANTHROPIC_MESSAGES:
        blocks = assistant["content"]
        thinking = next((b for b in blocks if b["type"] == "thinking"), None)
        tool_use = next(b for b in blocks if b["type"] == "tool_use")
        return Replayed(
            thinking["thinking"] if thinking else None,
            tool_use["name"],
            tool_use["input"],
            None,
        )
    function = assistant["tool_calls"][0]["function"]
    return Replayed(
        assistant.get("reasoning_content"),
        function["name"],
        json.loads(function["arguments"]),
        function["arguments"],
    )


def decoded_tool_turn(record: CompletionRecord, tokenizer: Any) -> tuple[str, dict[str, Any]]:
    """(reasoning, the tool call object) of a recorded tool-call turn, from its ids."""
    decoded = tokenizer.decode(list(record.output_ids))
    reasoning, sep, rest = decoded.partition("</think>\n\n")
    assert sep, decoded
    opening, closing = "<tool_call>\n", f"\n</tool_call>{EOT}"
    assert rest.startswith(opening) and rest.endswith(closing), rest
    return reasoning, json.loads(rest[len(opening) : -len(closing)])


@pytest.mark.slow
@pytest.mark.parametrize("capture", CAPTURES)
@pytest.mark.parametrize("name", list(CASES))
def test_cli_completes_a_tool_round_trip_through_the_gateway(
    name: str,
    capture: str,
    make_stack: Any,
    make_spec: Callable[..., RunSpec],
    installed: Callable[[Harness], Path],
    harness_cache: Path,
    tokenizer: Any,
) -> None:
    run_case(CASES[name], capture, make_stack, make_spec, installed, harness_cache, tokenizer)


@pytest.mark.slow
def test_gemini_cli_on_its_auto_model_is_served_under_every_name_it_asks_for(
    make_stack: Any,
    make_spec: Callable[..., RunSpec],
    installed: Callable[[Harness], Path],
    harness_cache: Path,
    tokenizer: Any,
) -> None:
    """The routing classifier (unary, a JSON schema, a Flash-Lite model), then the
    agent turns under the model it picked: one engine serves them all, each record
    keeps the name asked for."""
    case = Case("gemini_cli", classifier=True, options=(("routing", True),))
    records = run_case(
        case, "engine_rendered", make_stack, make_spec, installed, harness_cache, tokenizer
    )
    classifier, *turns = records
    assert classifier.stream is False and all(r.stream for r in turns)
    asked = [r.original_request["model"] for r in records]
    assert asked[0] != asked[1] == asked[2] and all(m.startswith("models/gemini-") for m in asked)
    assert "responseJsonSchema" in classifier.original_request["generationConfig"]


@pytest.mark.slow
def test_opencode_without_the_title_call_makes_only_agent_calls(
    make_stack: Any,
    make_spec: Callable[..., RunSpec],
    installed: Callable[[Harness], Path],
    harness_cache: Path,
    tokenizer: Any,
) -> None:
    case = Case("opencode", options=(("title_call", False),))
    run_case(case, "engine_rendered", make_stack, make_spec, installed, harness_cache, tokenizer)


def run_case(
    case: Case,
    capture: str,
    make_stack: Any,
    make_spec: Callable[..., RunSpec],
    installed: Callable[[Harness], Path],
    harness_cache: Path,
    tokenizer: Any,
) -> list[CompletionRecord]:
    harness = load_harness(case.harness, dict(case.options))
    installed(harness)
    stack = make_stack(script_for(case, capture), capture=capture)
    session_id, key = stack.new_session(harness=case.harness)
    spec = make_spec(
        gateway_url=stack.url,
        api_key=key,
        instruction="Write the word polar into proof.txt using the shell.",
        timeout_s=180.0,
    )

    run = run_harness(harness, spec, cache_dir=harness_cache)

    result = run.result
    detail = (
        f"exit {result.exit_code}\n"
        f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"
    )
    assert not result.timed_out, detail
    stack.engine.assert_clean()
    assert result.exit_code == 0, detail
    assert (spec.workdir / "proof.txt").read_text() == "polar\n"

    records = stack.records(session_id)
    assert len(records) == len(stack.engine.requests) == 2 + int(case.title_call or case.classifier)
    assert [r.seq for r in records] == list(range(1, len(records) + 1))
    for record in records:
        assert record.status is RecordStatus.COMPLETED, record.error
        assert record.dialect is harness.dialect
        assert record.prompt_ids and record.output_ids
        assert list(record.output_logprobs) == [
            logprob_for(i, t) for i, t in enumerate(record.output_ids)
        ]
    first, second = records[-2:]

    # The tool-call turn: what was sampled is what the CLI got and sent back.
    reasoning, call = decoded_tool_turn(first, tokenizer)
    assert reasoning == f"{REASONING}\n"
    assert call == {"name": case.shell_tool, "arguments": {case.argument: COMMAND}}
    replay = replayed_turn(second.dialect, second.original_request)
    assert (replay.name, replay.arguments) == (call["name"], call["arguments"])
    if replay.reasoning is not None:
        # qwen_code trims the reasoning it replays; the others keep it exactly.
        assert replay.reasoning.strip() == reasoning.strip()
    if replay.raw_arguments is not None and case.harness == "codex":
        # Codex replays the argument text byte for byte.
        assert f'"arguments": {replay.raw_arguments}}}' in tokenizer.decode(list(first.output_ids))

    # The last turn: an empty thought, then what ended the run.
    if case.ends_with_a_command:
        _, call = decoded_tool_turn(second, tokenizer)
        assert call == {"name": case.shell_tool, "arguments": {case.argument: MINI_DONE}}
    else:
        thought, _, answer = tokenizer.decode(list(second.output_ids)).partition("</think>\n\n")
        assert not thought.strip() and answer == f"{FINAL}{EOT}"
        assert FINAL in result.stdout, detail

    if capture == "token_in_token_out":
        # The CLI only appended the tool result: the gateway spliced its raw ids.
        lineage = second.lineage
        assert lineage is not None and lineage.origin is PromptOrigin.EXTENDS and lineage.spliced
        assert second.prompt_ids[: len(first.prompt_ids) + len(first.output_ids)] == (
            first.prompt_ids + first.output_ids
        )
    return records
