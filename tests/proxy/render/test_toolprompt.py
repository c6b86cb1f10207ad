"""Tools for a template without a tool section (SmolLM2's): written into the
messages in the hermes format, rendered as ``apply_chat_template`` renders
those messages, and append-only after every assistant turn."""

from __future__ import annotations

import json
from typing import Any

import pytest

from polar.configfile import ConfigError
from polar.ir import Message, Role, TextPart, ToolCall, ToolSpec
from polar.proxy.call.capture import build_capture
from polar.proxy.config import load_gateway_config
from polar.proxy.render.template import ChatTemplate
from polar.proxy.render.toolprompt import ToolPrompt

BASH = ToolSpec(
    name="bash",
    description="Run a shell command.",
    parameters={
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
)
READ = ToolSpec(
    name="read",
    description=None,
    parameters={"type": "object", "properties": {"path": {"type": "string"}}},
    strict=False,
)

# The tool section as docs/architecture.md and polar.proxy.render.toolprompt show it.
SECTION = (
    "# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n"
    '{"type": "function", "function": {"name": "bash", "description": "Run a shell command.", '
    '"parameters": {"type": "object", "properties": {"command": {"type": "string"}}, '
    '"required": ["command"]}}}\n'
    '{"type": "function", "function": {"name": "read", "description": null, '
    '"parameters": {"type": "object", "properties": {"path": {"type": "string"}}}, '
    '"strict": false}}\n'
    "</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n"
    "<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>"
)


def text(role: Role, value: str, **fields: Any) -> Message:
    return Message(role=role, parts=(TextPart(value),), **fields)


def call(call_id: str, name: str, arguments: dict[str, Any]) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=json.dumps(arguments))


SYSTEM = text(Role.SYSTEM, "You are a coding agent.")
USER = text(Role.USER, "How many files are in /tmp, and what does a.py say?")
CALLS = Message(
    role=Role.ASSISTANT,
    parts=(
        TextPart("I will look."),
        call("c1", "bash", {"command": "ls /tmp | wc -l"}),
        call("c2", "read", {"path": "/tmp/a.py"}),
    ),
)
RESULTS = (
    text(Role.TOOL, "3", tool_call_id="c1"),
    text(Role.TOOL, "print('é')", tool_call_id="c2"),
)
ANSWER = text(Role.ASSISTANT, "There are 3 files; a.py prints é.")
THANKS = text(Role.USER, "Thanks.")


@pytest.fixture(scope="module")
def template(smollm2_tokenizer: Any) -> ChatTemplate:
    return ChatTemplate(smollm2_tokenizer)


def expected_ids(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    return list(
        tokenizer.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=True, return_dict=False
        )
    )


def test_auto_writes_tools_in_only_for_a_template_without_them(
    template: ChatTemplate, tokenizer: Any, smollm2_tokenizer: Any
) -> None:
    assert template.tool_prompt is ToolPrompt.HERMES
    assert ChatTemplate(tokenizer).tool_prompt is ToolPrompt.TEMPLATE  # Qwen3 has a tool section
    chosen = ChatTemplate(smollm2_tokenizer, tool_prompt=ToolPrompt.TEMPLATE)
    assert chosen.tool_prompt is ToolPrompt.TEMPLATE
    assert template.end_of_turn == "<|im_end|>"


@pytest.mark.parametrize(
    "conversation",
    [
        [USER],
        [SYSTEM, USER],
        [SYSTEM, USER, ANSWER, THANKS],
        [USER, ANSWER, THANKS, ANSWER, THANKS],
        [text(Role.DEVELOPER, "Be brief."), text(Role.USER, "  spaces kept \n")],
    ],
    ids=["user", "system", "two turns", "no system, three turns", "developer"],
)
def test_a_conversation_without_tools_renders_as_apply_chat_template(
    template: ChatTemplate, smollm2_tokenizer: Any, conversation: list[Message]
) -> None:
    plain = [
        {"role": "system" if m.role is Role.DEVELOPER else m.role.value, "content": m.text}
        for m in conversation
    ]

    ids, _ = template.render(conversation, (), kwargs={})

    assert ids == expected_ids(smollm2_tokenizer, plain)


def test_tools_calls_and_results_render_as_documented(
    template: ChatTemplate, smollm2_tokenizer: Any
) -> None:
    conversation = [SYSTEM, USER, CALLS, *RESULTS, ANSWER, THANKS]
    written = [
        {"role": "system", "content": f"You are a coding agent.\n\n{SECTION}"},
        {"role": "user", "content": USER.text},
        {
            "role": "assistant",
            "content": "I will look.\n"
            '<tool_call>\n{"name": "bash", "arguments": {"command": "ls /tmp | wc -l"}}\n'
            "</tool_call>\n"
            '<tool_call>\n{"name": "read", "arguments": {"path": "/tmp/a.py"}}\n</tool_call>',
        },
        {"role": "tool", "content": "<tool_response>\n3\n</tool_response>"},
        {"role": "tool", "content": "<tool_response>\nprint('é')\n</tool_response>"},
        {"role": "assistant", "content": ANSWER.text},
        {"role": "user", "content": "Thanks."},
    ]

    ids, rendered = template.render(conversation, (BASH, READ), kwargs={})

    assert ids == expected_ids(smollm2_tokenizer, written)
    assert "<|im_start|>tool\n<tool_response>\n3\n</tool_response><|im_end|>\n" in rendered


def test_without_a_system_message_the_tools_are_one_of_their_own(
    template: ChatTemplate, smollm2_tokenizer: Any
) -> None:
    ids, rendered = template.render([USER], (BASH, READ), kwargs={})

    written = [{"role": "system", "content": SECTION}, {"role": "user", "content": USER.text}]
    assert ids == expected_ids(smollm2_tokenizer, written)
    assert rendered.startswith("<|im_start|>system\n# Tools\n")


@pytest.mark.parametrize("incremental", [True, False])
def test_what_follows_an_assistant_turn_is_appended_to_its_tokens(
    template: ChatTemplate, smollm2_tokenizer: Any, incremental: bool
) -> None:
    """Splicing's premise: the render of a longer conversation is the render of
    the shorter one, the assistant turn as sampled, and the continuation."""
    tools = (BASH, READ)
    whole = [SYSTEM, USER, CALLS, *RESULTS, ANSWER, THANKS]
    for turn in (2, 5):  # the calls, then the answer
        head, _ = template.render(whole[:turn], tools, kwargs={})
        written = _as_the_model_writes_it(whole[turn])
        sampled = smollm2_tokenizer.encode(written, add_special_tokens=False)
        tail, _ = template.continuation(whole, tools, turn, kwargs={}, incremental=incremental)
        full, _ = template.render(whole, tools, kwargs={})
        assert full == head + sampled + [template.end_of_turn_id] + tail, f"after message {turn}"


def _as_the_model_writes_it(message: Message) -> str:
    parts = [message.text] + [
        f'<tool_call>\n{{"name": "{c.name}", "arguments": {c.arguments}}}\n</tool_call>'
        for c in message.tool_calls
    ]
    return "\n".join(p for p in parts if p)


def test_hermes_with_another_call_format_is_a_one_line_error(tmp_path: Any) -> None:
    base = {
        "admin_token": "0123456789abcdef0123",
        "capture": "token_in_token_out",
        "engine": {"kind": "embedded", "base_url": "http://127.0.0.1:9", "model": "m"},
        "store": {"path": str(tmp_path / "r.db")},
    }
    with pytest.raises(ConfigError) as chosen:
        load_gateway_config(
            None, {**base, "render": {"tool_prompt": "hermes", "tool_format": "qwen3_coder"}}
        )
    assert str(chosen.value) == (
        "render.tool_prompt: Value error, asks for hermes tool calls: set tool_format: hermes"
    )


def test_auto_on_a_template_without_tools_needs_the_hermes_parser(
    tmp_path: Any, smollm2_dir: Any
) -> None:
    config = load_gateway_config(
        None,
        {
            "admin_token": "0123456789abcdef0123",
            "capture": "token_in_token_out",
            "engine": {"kind": "embedded", "base_url": "http://127.0.0.1:9", "model": "m"},
            "store": {"path": str(tmp_path / "r.db")},
            "render": {"tokenizer": str(smollm2_dir), "tool_format": "qwen3_coder"},
        },
    )
    with pytest.raises(
        ConfigError, match=r"^render.tool_prompt: the chat template of .* has no tool section"
    ):
        build_capture(config)
