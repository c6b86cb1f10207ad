"""Parsing sampled text into reasoning, text and tool calls, however it is chunked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from polar.ir import Delta, ToolSpec
from polar.proxy.call.relay import Accumulator
from polar.proxy.render.parse import OutputParser, ParserOptions, Piece, ToolFormat

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"

BASH = ToolSpec(
    name="bash",
    parameters={"type": "object", "properties": {"command": {"type": "string"}}},
)
EDIT = ToolSpec(
    name="edit",
    parameters={
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "line": {"type": "integer"},
            "dry_run": {"type": "boolean"},
            "text": {"type": "string"},
        },
    },
)
TOOLS = (BASH, EDIT)


def _real_vllm_output() -> str:
    """The text real vLLM sampled in tests/fixtures/vllm/tool_nonstream.json."""
    reply = json.loads((FIXTURES / "vllm" / "tool_nonstream.json").read_text())
    return "".join(e["token"] for e in reply["choices"][0]["logprobs"]["content"][:-1])


HERMES_OUTPUTS = {
    "real vllm output": _real_vllm_output(),
    "reasoning, text and two calls": (
        "I should look first.\n</think>\n\nLet me check.\n<tool_call>\n"
        '{"name": "bash", "arguments": {"command": "ls -la \\"my dir\\""}}\n</tool_call>\n'
        '<tool_call>\n{"name": "edit", "arguments": {"path": "a.py", "line": 3}}\n</tool_call>'
    ),
    "unicode and nested arguments": (
        "\n</think>\n\n<tool_call>\n"
        '{"name": "edit", "arguments": {"path": "ü/文件.py", "text": "x = {\\"a\\": [1, 2]}\\n"}}'
        "\n</tool_call>"
    ),
    "plain text": "thinking\n</think>\n\nThe answer is 42. No <tool call here.",
    "keys in the other order": (
        '</think>\n\n<tool_call>\n{"arguments": {"command": "pwd"}, "name": "bash"}\n</tool_call>'
    ),
    "arguments as a string": (
        '</think>\n\n<tool_call>\n{"name": "bash", "arguments": "{\\"command\\": \\"id\\"}"}\n'
        "</tool_call>"
    ),
}

XML_OUTPUTS = {
    "one call": (
        "plan\n</think>\n\nRunning it.\n<tool_call>\n<function=bash>\n<parameter=command>\n"
        "ls -la\n</parameter>\n</function>\n</tool_call>"
    ),
    "typed and multi-line parameters": (
        "</think>\n\n<tool_call>\n<function=edit>\n<parameter=path>\nsrc/a.py\n</parameter>\n"
        "<parameter=line>\n12\n</parameter>\n<parameter=dry_run>\ntrue\n</parameter>\n"
        '<parameter=text>\ndef f():\n    return "x"\n\n</parameter>\n</function>\n</tool_call>'
    ),
}


def _parse(
    text: str, cuts: list[int], fmt: ToolFormat, in_reasoning: bool = True
) -> tuple[Any, Any]:
    ids = iter(range(100))
    parser = OutputParser(
        ParserOptions(tool_format=fmt),
        tools=TOOLS,
        in_reasoning=in_reasoning,
        make_id=lambda: f"call_{next(ids)}",
    )
    acc = Accumulator()
    start = 0
    for cut in [*cuts, len(text)]:
        piece = parser.feed(text[start:cut])
        acc.add(_delta(piece))
        start = cut
    acc.add(_delta(parser.finish()))
    return acc.message(), parser.malformed


def _delta(piece: Piece) -> Delta:
    return Delta(text=piece.text, reasoning=piece.reasoning, tool_calls=tuple(piece.tool_calls))


@pytest.mark.parametrize(("fmt", "name"), [
    *[(ToolFormat.HERMES, n) for n in HERMES_OUTPUTS],
    *[(ToolFormat.QWEN3_CODER, n) for n in XML_OUTPUTS],
])  # fmt: skip
def test_every_split_point_gives_the_whole_text_result(fmt: ToolFormat, name: str) -> None:
    text = (HERMES_OUTPUTS if fmt is ToolFormat.HERMES else XML_OUTPUTS)[name]
    whole, malformed = _parse(text, [], fmt)
    assert malformed == []
    for cut in range(1, len(text)):
        assert _parse(text, [cut], fmt) == (whole, malformed), cut
    # and one character at a time
    assert _parse(text, list(range(1, len(text))), fmt) == (whole, malformed)


def test_hermes_calls_are_parsed_exactly() -> None:
    message, _ = _parse(HERMES_OUTPUTS["reasoning, text and two calls"], [], ToolFormat.HERMES)
    assert message.reasoning == "I should look first.\n"
    assert message.text == "\n\nLet me check.\n"
    calls = message.tool_calls
    assert [(c.id, c.name) for c in calls] == [("call_0", "bash"), ("call_1", "edit")]
    assert calls[0].arguments == '{"command": "ls -la \\"my dir\\""}'
    assert json.loads(calls[1].arguments) == {"path": "a.py", "line": 3}


def test_real_vllm_output_parses_like_vllm_did() -> None:
    reply = json.loads((FIXTURES / "vllm" / "tool_nonstream.json").read_text())
    message, _ = _parse(HERMES_OUTPUTS["real vllm output"], [], ToolFormat.HERMES)
    vllm_call = reply["choices"][0]["message"]["tool_calls"][0]["function"]
    assert message.text == reply["choices"][0]["message"]["content"]
    assert [(c.name, json.loads(c.arguments)) for c in message.tool_calls] == [
        (vllm_call["name"], json.loads(vllm_call["arguments"]))
    ]


def test_xml_parameters_become_typed_json() -> None:
    message, _ = _parse(XML_OUTPUTS["typed and multi-line parameters"], [], ToolFormat.QWEN3_CODER)
    (call,) = message.tool_calls
    assert call.name == "edit"
    assert json.loads(call.arguments) == {
        "path": "src/a.py",
        "line": 12,
        "dry_run": True,
        "text": 'def f():\n    return "x"\n',
    }


def test_string_arguments_stream_before_the_call_ends() -> None:
    parser = OutputParser(ParserOptions(), tools=TOOLS, in_reasoning=False)
    piece = parser.feed('<tool_call>\n{"name": "bash", "arguments": {"command": "echo hello wor')
    assert piece.tool_calls[0].name == "bash"
    assert "".join(d.arguments for d in piece.tool_calls) == '{"command": "echo hello wor'
    xml = OutputParser(
        ParserOptions(tool_format=ToolFormat.QWEN3_CODER), tools=TOOLS, in_reasoning=False
    )
    piece = xml.feed("<tool_call>\n<function=bash>\n<parameter=command>\necho hel")
    assert "".join(d.arguments for d in piece.tool_calls) == '{"command": "echo hel'


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            '</think>\n\n<tool_call>\n{"name": "bash", "arguments": {"command": }\n</tool_call>',
            "JSON",
        ),
        ("</think>\n\n<tool_call>\n[1, 2]\n</tool_call>", "expected"),
        ('</think>\n\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls', "ended inside"),
    ],
)
def test_malformed_calls_come_back_as_text_and_are_reported(text: str, reason: str) -> None:
    for cuts in ([], list(range(1, len(text)))):
        message, malformed = _parse(text, cuts, ToolFormat.HERMES)
        (bad,) = malformed
        assert reason in bad.reason
        assert bad.raw in message.text
        assert text.split("</think>")[1].strip() in message.text.strip() or "ended" in reason


def test_text_after_a_call_is_kept_but_glue_whitespace_is_not() -> None:
    text = '</think>\n\n<tool_call>\n{"name": "bash", "arguments": {}}\n</tool_call>\nAfterthought.'
    message, _ = _parse(text, [], ToolFormat.HERMES)
    assert message.text == "\n\n\nAfterthought."
    assert message.tool_calls[0].arguments == "{}"
    assert _parse(text, list(range(1, len(text))), ToolFormat.HERMES)[0] == message
    glue_only, _ = _parse(text.removesuffix("Afterthought.") + " \n", [], ToolFormat.HERMES)
    assert glue_only.text == "\n\n"


def test_tags_are_text_when_no_tools_were_offered() -> None:
    parser = OutputParser(ParserOptions(), tools=(), in_reasoning=False)
    piece = parser.feed('<tool_call>{"name": "x", "arguments": {}}</tool_call>')
    piece.extend(parser.finish())
    assert piece.text == '<tool_call>{"name": "x", "arguments": {}}</tool_call>'
    assert piece.tool_calls == []


def test_think_block_opened_by_the_model() -> None:
    message, _ = _parse("<think>\nhmm\n</think>\n\nhi", [2], ToolFormat.HERMES, in_reasoning=False)
    assert message.reasoning == "\nhmm\n"
    assert message.text == "\n\nhi"
