"""Append-only prompts, with the real Qwen3 tokenizer and chat template.

Sessions are generated: assistant turns with and without reasoning, text and
tool calls; the harness resends each turn the way real harnesses do
(arguments re-serialized, whitespace trimmed, reasoning dropped, text as
parts), then appends tool results or a new user message. The gateway's planner
must extend the previous prompt token for token every time; when the test
edits history instead, the divergence must be recorded at the right token.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polar.ir import Message, PromptOrigin, Role, TextPart, ToolCall, ToolSpec
from polar.ir.tokenids import common_prefix, pack
from polar.proxy.render.parse import OutputParser, ParserOptions
from polar.proxy.render.splice import PastCall, Transcript, Transcripts, lineage_of, plan_prompt
from polar.proxy.render.template import ChatTemplate

TOOLS = (
    ToolSpec(
        name="bash",
        description="Run a command.",
        parameters={"type": "object", "properties": {"command": {"type": "string"}}},
    ),
    ToolSpec(
        name="edit",
        description="Edit a file.",
        parameters={
            "type": "object",
            "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
        },
    ),
)
SYSTEM = Message(role=Role.SYSTEM, parts=(TextPart("You are a coding agent."),))

words = st.text(
    alphabet=st.sampled_from(list("abcdefghij klmnop_.-/\"'{}[]é中 \n")), min_size=1, max_size=30
).filter(lambda s: s.strip() and "</think>" not in s and "<tool" not in s)
arguments = st.one_of(
    st.fixed_dictionaries({"command": words}),
    st.fixed_dictionaries({"path": words, "text": words}),
)
assistant_turns = st.fixed_dictionaries(
    {
        "reasoning": st.one_of(st.none(), words),
        "text": st.one_of(st.just(""), words),
        "calls": st.lists(arguments, max_size=2),
    }
)
resend_styles = st.fixed_dictionaries(
    {
        "compact_args": st.booleans(),
        "sorted_args": st.booleans(),
        "strip_text": st.booleans(),
        "keep_reasoning": st.booleans(),
        "empty_text_part": st.booleans(),
    }
)


@pytest.fixture(scope="module")
def template(tokenizer: Any) -> ChatTemplate:
    return ChatTemplate(tokenizer)


def sampled_text(turn: dict[str, Any]) -> str:
    """What a Qwen3 model writes after the ``<think>\\n`` generation prompt."""
    out = (turn["reasoning"] or "").strip("\n") + "\n</think>\n\n" + turn["text"]
    for i, args in enumerate(turn["calls"]):
        if i or turn["text"]:
            out += "\n"
        name = "bash" if "command" in args else "edit"
        body = json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
        out += f"<tool_call>\n{body}\n</tool_call>"
    return out + "<|im_end|>"


def returned_message(text: str) -> Message:
    """The assistant message the gateway returns for that output."""
    counter = iter(range(1000))
    parser = OutputParser(
        ParserOptions(), tools=TOOLS, in_reasoning=True, make_id=lambda: f"call_{next(counter)}"
    )
    piece = parser.feed(text.removesuffix("<|im_end|>"))
    piece.extend(parser.finish())
    parts: list[Any] = []
    if piece.text:
        parts.append(TextPart(piece.text))
    calls: dict[int, list[str]] = {}
    for delta in piece.tool_calls:
        slot = calls.setdefault(delta.index, ["", "", ""])
        slot[0] = delta.id or slot[0]
        slot[1] += delta.name or ""
        slot[2] += delta.arguments
    parts.extend(ToolCall(id=i, name=n, arguments=a) for i, n, a in calls.values())
    return Message(role=Role.ASSISTANT, parts=tuple(parts))


def resend(message: Message, reasoning: str | None, style: dict[str, bool]) -> Message:
    """The same turn as a harness sends it back."""
    parts: list[Any] = []
    if style["keep_reasoning"] and reasoning:
        from polar.ir import ReasoningPart

        parts.append(ReasoningPart(reasoning))
    text = message.text.strip() if style["strip_text"] else message.text
    if text or style["empty_text_part"]:
        parts.append(TextPart(text))
    for call in message.tool_calls:
        args = json.loads(call.arguments)
        separators = (",", ":") if style["compact_args"] else (", ", ": ")
        parts.append(
            ToolCall(
                id=call.id,
                name=call.name,
                arguments=json.dumps(args, separators=separators, sort_keys=style["sorted_args"]),
            )
        )
    return Message(role=Role.ASSISTANT, parts=tuple(parts))


def run_session(
    template: ChatTemplate, turns: list[dict[str, Any]], styles: list[dict[str, bool]]
) -> tuple[list[Message], Transcript, list[tuple[int, ...]]]:
    transcript = Transcript()
    messages = [SYSTEM, Message(role=Role.USER, parts=(TextPart("Fix the bug."),))]
    fulls: list[tuple[int, ...]] = []
    for k, (generated, style) in enumerate(zip(turns, styles, strict=True)):
        # Every turn says something of its own, so no two turns are the same turn.
        turn = {**generated, "text": f"({k}) {generated['text']}"}
        plan = plan_prompt(template, messages, TOOLS, transcript, kwargs={})
        if k == 0:
            assert plan.lineage.origin is PromptOrigin.FRESH
        else:
            previous = fulls[-1]
            assert plan.lineage.origin is PromptOrigin.EXTENDS, plan.lineage
            assert plan.lineage.spliced and plan.lineage.shared_tokens == len(previous)
            assert plan.ids[: len(previous)] == previous
            # The new tokens are exactly what the template renders after that turn.
            full_tail, _ = template.continuation(
                messages, TOOLS, len(transcript.calls[-1].messages), kwargs={}, incremental=False
            )
            assert list(plan.ids[len(previous) :]) == full_tail
        text = sampled_text(turn)
        output = tuple(template.text.encode(text))
        message = returned_message(text)
        transcript.add(PastCall.of(k + 1, 1, tuple(messages), plan.ids, output, message))
        fulls.append(plan.ids + output)
        messages.append(resend(message, turn["reasoning"], style))
        if message.tool_calls:
            for call in message.tool_calls:
                content = f"ran {call.name}"
                parts = (TextPart(content),)
                messages.append(Message(role=Role.TOOL, parts=parts, tool_call_id=call.id))
        else:
            messages.append(Message(role=Role.USER, parts=(TextPart(f"next step {k}"),)))
    return messages, transcript, fulls


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.data())
def test_appending_clients_get_append_only_prompts(template: ChatTemplate, data: Any) -> None:
    n = data.draw(st.integers(min_value=2, max_value=6))
    turns = data.draw(st.lists(assistant_turns, min_size=n, max_size=n))
    styles = data.draw(st.lists(resend_styles, min_size=n, max_size=n))
    run_session(template, turns, styles)


def _shared(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.data())
def test_edited_history_is_recorded_with_its_position(template: ChatTemplate, data: Any) -> None:
    n = data.draw(st.integers(min_value=2, max_value=5))
    turns = data.draw(st.lists(assistant_turns, min_size=n, max_size=n))
    styles = data.draw(st.lists(resend_styles, min_size=n, max_size=n))
    messages, transcript, fulls = run_session(template, turns, styles)
    edit = data.draw(st.sampled_from(["user text", "drop first turn", "compact"]))
    if edit == "user text":
        edited = Message(role=Role.USER, parts=(TextPart("Fix the bug!"),))
        messages = [messages[0], edited, *messages[2:]]
    elif edit == "drop first turn":
        # The first assistant turn and what answered it go; later turns stay.
        second = next(i for i, m in enumerate(messages) if i > 2 and m.role is Role.ASSISTANT)
        messages = messages[:2] + messages[second:]
    else:
        messages = [
            messages[0],
            Message(role=Role.USER, parts=(TextPart("Summary: work so far."),)),
        ]
    plan = plan_prompt(template, messages, TOOLS, transcript, kwargs={})
    assert plan.lineage.origin is PromptOrigin.DIVERGED
    best = max(fulls, key=lambda full: _shared(plan.ids, full))
    assert plan.lineage.shared_tokens == _shared(plan.ids, best)
    position = plan.lineage.shared_tokens
    assert position < len(best) and plan.ids[position] != best[position]


def test_reasoning_dropped_by_the_template_does_not_break_the_splice(
    template: ChatTemplate,
) -> None:
    """Qwen3's template drops earlier <think> blocks once a new user query follows;
    rendering the history again would not extend the previous prompt, the splice does."""
    turn = {"reasoning": "think hard", "text": "Done.", "calls": []}
    style = dict.fromkeys(resend_styles.wrapped_strategy.mapping, False)  # type: ignore[attr-defined]
    messages, transcript, fulls = run_session(template, [turn, turn], [style, style])
    rendered, _ = template.render(messages, TOOLS, kwargs={})
    assert tuple(rendered[: len(fulls[0])]) != fulls[0], "the template rewrites history"
    plan = plan_prompt(template, messages, TOOLS, transcript, kwargs={})
    assert plan.ids[: len(fulls[1])] == fulls[1]


def test_a_truncated_turn_is_closed_with_the_end_of_turn_token(template: ChatTemplate) -> None:
    messages = [SYSTEM, Message(role=Role.USER, parts=(TextPart("Go."),))]
    transcript = Transcript()
    first = plan_prompt(template, messages, TOOLS, transcript, kwargs={})
    cut = tuple(template.text.encode("half a thou"))  # no <|im_end|>: length limit
    reply = Message(role=Role.ASSISTANT, parts=(TextPart("half a thou"),))
    transcript.add(PastCall.of(1, 1, tuple(messages), first.ids, cut, reply))
    messages += [reply, Message(role=Role.USER, parts=(TextPart("continue"),))]
    second = plan_prompt(template, messages, TOOLS, transcript, kwargs={})
    head = first.ids + cut
    assert second.ids[: len(head)] == head
    assert second.ids[len(head)] == template.end_of_turn_id


def test_transcripts_are_bounded_by_bytes_least_recently_used_first() -> None:
    reply = Message(role=Role.ASSISTANT, parts=(TextPart("ok"),))
    transcripts = Transcripts(budget_bytes=10_000)

    def call(session: str, tokens: int) -> None:
        transcript = transcripts.get(session)
        on = transcript.calls[-1] if transcript.calls else None
        prompt = (on.full.ids() if on else ()) + tuple(range(tokens))
        transcript.add(PastCall.of(len(transcript.calls) + 1, 1, (), prompt, (7,), reply, on=on))

    call("a", 1000)  # 4,004 bytes
    call("b", 1000)
    assert transcripts.bytes == 8008 and len(transcripts) == 2
    call("a", 100)  # continues a's call: only its new 101 tokens are added
    assert transcripts.bytes == 8412
    call("c", 1000)  # over budget: b, the least recently used, goes
    assert len(transcripts) == 2 and transcripts.bytes == 8412
    assert not transcripts.get("b").calls
    call("a", 5000)  # one session past the budget keeps its own, the others go
    assert transcripts.bytes == 4408 + 20004 and len(transcripts) == 1
    transcripts.drop("a")
    assert transcripts.bytes == 0 and len(transcripts) == 0


@pytest.mark.parametrize("seed", range(8))
def test_a_diverged_prompt_names_the_latest_call_sharing_the_most(seed: int) -> None:
    """The lineage search (newest first, skipping calls that cannot share more,
    stopping at a prompt shared whole) finds what comparing every call finds:
    the longest shared prefix, the latest call among those that tie."""
    rng = random.Random(seed)
    user = Message(role=Role.USER, parts=(TextPart("different"),))
    output = Message(role=Role.ASSISTANT, parts=(TextPart("x"),))
    for case in range(40):
        stem = [rng.randint(0, 9) for _ in range(rng.randint(0, 12))]
        transcript = Transcript()
        for seq in range(1, rng.randint(1, 10)):
            ids = stem[: rng.randint(0, len(stem))] + [
                rng.randint(0, 3) for _ in range(rng.randint(0, 6))
            ]
            prompt, sampled = ids[: len(ids) // 2 + 1], ids[len(ids) // 2 + 1 :]
            on = transcript.calls[-1] if transcript.calls and rng.random() < 0.5 else None
            transcript.add(PastCall.of(seq, 1, (user,), prompt, sampled, output, on=on))
        prompt = stem[: rng.randint(0, len(stem))] + [
            rng.randint(0, 3) for _ in range(rng.randint(0, 4))
        ]
        expected = None
        for call in transcript.calls:  # oldest first; a later tie wins
            shared = common_prefix(pack(prompt), call.full.packed())
            if shared and (expected is None or shared >= expected[0]):
                expected = (shared, call.seq)
        lineage = lineage_of(prompt, (user, user), transcript)
        got = (
            None
            if lineage.origin is PromptOrigin.FRESH
            else (lineage.shared_tokens, lineage.base_seq)
        )
        assert got == expected, f"seed {seed} case {case}"
        if expected is not None:
            assert lineage.origin is PromptOrigin.DIVERGED
