"""The compiled chat template renders what ``apply_chat_template`` renders.

Every comparison is against the real thing: transformers' own
``apply_chat_template`` on the real Qwen3 tokenizer, and on the same tokenizer
given other templates written here to reach the parts of transformers'
environment Qwen3's template does not use (``namespace``, ``dict``,
``tojson`` options, loop controls, ``raise_exception``, the ``generation``
tag, a ``tool_use`` template, attributes the sandbox refuses).
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import jinja2
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from polar.ir import Message, ReasoningPart, Role, TextPart, ToolCall, ToolSpec
from polar.proxy.errors import InvalidRequest
from polar.proxy.render.compiled import CompiledTemplate, compiled_template, reserved_kwargs
from polar.proxy.render.template import ChatTemplate, template_message, template_tools

TOOLS = (
    ToolSpec(
        name="bash",
        description="Run a command.",
        parameters={
            "type": "object",
            "properties": {"command": {"type": "string", "description": "the <cmd> & args"}},
            "required": ["command"],
        },
    ),
    ToolSpec(name="think", description=None, parameters={"type": "object"}, strict=False),
)
WORDS = ["ls", "é", "<b>", "&amp;", '"q"', "\\n", "{{ x }}", "<|im_start|>", "\n", "  ", "日本"]


def _text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 6)))


def _conversation(rng: random.Random) -> list[Message]:
    """A random conversation: system or not, user turns, assistant turns with
    and without reasoning and tool calls, tool results, user turns at the end or not."""
    messages: list[Message] = []
    if rng.random() < 0.7:
        messages.append(
            Message(role=rng.choice([Role.SYSTEM, Role.DEVELOPER]), parts=(TextPart(_text(rng)),))
        )
    messages.append(Message(role=Role.USER, parts=(TextPart(_text(rng)),)))
    for k in range(rng.randint(0, 4)):
        parts: list[Any] = []
        if rng.random() < 0.5:
            parts.append(ReasoningPart(_text(rng)))
        parts.append(TextPart(_text(rng)))
        calls = []
        for c in range(rng.randint(0, 2)):
            arguments = json.dumps({"command": _text(rng)}) if rng.random() < 0.8 else "not json"
            calls.append(ToolCall(id=f"call_{k}_{c}", name="bash", arguments=arguments))
        messages.append(Message(role=Role.ASSISTANT, parts=(*parts, *calls)))
        for call in calls:
            messages.append(
                Message(
                    role=Role.TOOL, parts=(TextPart(_text(rng)),), tool_call_id=call.id, name="bash"
                )
            )
        if not calls or rng.random() < 0.5:
            messages.append(Message(role=Role.USER, parts=(TextPart(_text(rng)),)))
    return messages


def _outcome(render: Any) -> tuple[str, str]:
    try:
        return ("text", render())
    except Exception as exc:
        return ("raised", f"{type(exc).__name__}: {exc}")


def _both(
    tokenizer: Any,
    compiled: CompiledTemplate,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    generation: bool,
    kwargs: dict[str, Any],
) -> tuple[tuple[str, str], tuple[str, str]]:
    expected = _outcome(
        lambda: tokenizer.apply_chat_template(
            copy.deepcopy(messages),
            tools=copy.deepcopy(tools),
            tokenize=False,
            add_generation_prompt=generation,
            **kwargs,
        )
    )
    got = _outcome(
        lambda: compiled.render(messages, tools, add_generation_prompt=generation, kwargs=kwargs)
    )
    return expected, got


@pytest.mark.parametrize("seed", range(6))
def test_random_conversations_render_as_apply_chat_template(tokenizer: Any, seed: int) -> None:
    compiled = compiled_template(tokenizer)
    assert compiled is not None, "the Qwen3 template should compile exactly"
    rng = random.Random(seed)
    for case in range(60):
        messages = [template_message(m) for m in _conversation(rng)]
        tools = template_tools(TOOLS) if rng.random() < 0.5 else None
        kwargs = rng.choice([{}, {"enable_thinking": False}, {"enable_thinking": True}])
        generation = rng.random() < 0.8
        expected, got = _both(tokenizer, compiled, messages, tools, generation, kwargs)
        assert got == expected, f"seed {seed} case {case}: {messages} {tools} {kwargs}"
        assert expected[0] == "text", f"seed {seed} case {case}: {expected}"


# Templates reaching what Qwen3's does not: each is rendered both ways.
TEMPLATES = {
    "namespace and loop controls": (
        "{% set ns = namespace(n=0, last='') %}"
        "{% for m in messages %}{% if m.role == 'tool' %}{% continue %}{% endif %}"
        "{% set ns.n = ns.n + 1 %}{% set ns.last = m.role %}"
        "[{{ loop.index0 }}:{{ m.role | upper }}]{{ m.content | trim }}"
        "{% if loop.index >= 5 %}{% break %}{% endif %}{% endfor %}"
        "n={{ ns.n }} last={{ ns.last }}"
    ),
    "tojson with options and dict": (
        "{% set d = dict(a=1, b=[1, 2]) %}{{ d | tojson }}{{ d | tojson(indent=2) }}"
        "{{ tools | tojson(separators=(',', ':'), sort_keys=True) }}"
        "{% for m in messages %}{{ m | tojson(ensure_ascii=True) }}{% endfor %}"
        "{{ dict.fromkeys(['x', 'y']) | tojson }}"
    ),
    "special tokens and kwargs": (
        "{{ bos_token }}{{ eos_token }}{% for m in messages %}{{ m['content'] }}{{ eos_token }}"
        "{% endfor %}{% if custom is defined %}{{ custom }}{% endif %}"
        "{% if add_generation_prompt %}GEN{% endif %}"
    ),
    "generation tag and reasoning aliases": (
        "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}"
        "{{ m.thinking }}|{{ m.reasoning_content }}|{{ m.content }}{% endgeneration %}"
        "{% else %}{{ m.content }}{% endif %}{{ m.keys() | list | join(',') }}{% endfor %}"
    ),
    "raise_exception": (
        "{% for m in messages %}{% if m.role == 'tool' %}"
        "{{ raise_exception('no tools here: ' ~ m.tool_call_id) }}{% endif %}"
        "{{ m.content }}{% endfor %}"
    ),
    "methods the sandbox allows": (
        "{% for m in messages %}{{ m.content.upper() }}{{ m.items() | list | length }}"
        "{{ m.content.split(' ') | join('+') }}{{ m.get('name', '-') }}{% endfor %}"
        "{{ messages.__class__ }}|{{ messages.pop }}|"
    ),
    "attributes the sandbox refuses": "{{ ''.__class__.__mro__ }}",
    "mutating a list": "{{ messages.append(1) }}",
    "str.format": "{{ '{}-{}'.format(messages | length, messages[0].role) }}",
}


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_other_templates_render_as_apply_chat_template(tokenizer: Any, name: str) -> None:
    other = copy.copy(tokenizer)
    other.chat_template = TEMPLATES[name]
    compiled = CompiledTemplate(other, _compile)
    rng = random.Random(7)
    for case in range(20):
        messages = [template_message(m) for m in _conversation(rng)]
        tools = template_tools(TOOLS) if case % 2 else None
        kwargs = {"custom": _text(rng)} if case % 3 else {}
        expected, got = _both(other, compiled, messages, tools, case % 4 != 0, kwargs)
        assert got == expected, f"{name} (seed 7) case {case}"


def test_a_tool_use_template_is_chosen_for_calls_with_tools(tokenizer: Any) -> None:
    other = copy.copy(tokenizer)
    other.chat_template = {
        "default": "plain {{ messages | length }}",
        "tool_use": "tools {{ tools | length }}",
    }
    compiled = CompiledTemplate(other, _compile)
    messages = [{"role": "user", "content": "hi"}]
    for tools in (None, template_tools(TOOLS)):
        expected, got = _both(other, compiled, messages, tools, True, {})
        assert got == expected
    assert compiled.render(messages, None, add_generation_prompt=True, kwargs={}) == "plain 1"


def _compile(source: str) -> Any:
    from transformers.utils.chat_template_utils import _compile_jinja_template

    return _compile_jinja_template(source)


def test_sandbox_decisions_are_remembered_per_type_and_name_exactly() -> None:
    """The sandbox says the same for two objects of one type (safe and unsafe
    names alike), so a decision remembered per (type, name) is its own."""
    env = ImmutableSandboxedEnvironment()

    def one() -> None:
        return None

    def two() -> int:
        return 2

    class Plain:
        x = 1

    pairs: list[tuple[Any, Any]] = [
        ({}, {"k": 1}),
        ([], [1, 2]),
        ("s", "other"),
        (1, 2),
        ((), (1,)),
        (set(), {1}),
        (one, two),
        (Plain(), Plain()),
        (Plain, type("Other", (), {"x": 2})),
        ("s".upper, "t".upper),
        ([].append, [1].append),
        (jinja2.utils.Namespace(a=1), jinja2.utils.Namespace(a=2)),
    ]
    names = [
        "append",
        "upper",
        "__class__",
        "mro",
        "__globals__",
        "__code__",
        "items",
        "pop",
        "x",
        "a",
        "update",
        "format",
        "add",
        "__self__",
        "__func__",
        "clear",
        "count",
    ]
    checked = 0
    for first, second in pairs:
        for name in names:
            if hasattr(first, name) and hasattr(second, name):
                said = env.is_safe_attribute(first, name, getattr(first, name))
                assert env.is_safe_attribute(second, name, getattr(second, name)) == said
                checked += 1
    assert checked > 30


def test_a_template_that_renders_differently_is_not_compiled(tokenizer: Any) -> None:
    """A transformers that did more per call than the module knows (here: its
    output changed after rendering) keeps apply_chat_template."""

    class Changed:
        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

        def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
            return self._inner.apply_chat_template(*args, **kwargs) + "!"

    assert compiled_template(tokenizer) is not None
    assert compiled_template(Changed(tokenizer)) is None
    template = ChatTemplate(Changed(tokenizer))
    hi = [Message(role=Role.USER, parts=(TextPart("hi"),))]
    assert template.render(hi, (), kwargs={})[1].endswith("!")


def test_template_kwargs_may_not_name_the_renders_own_arguments(tokenizer: Any) -> None:
    template = ChatTemplate(tokenizer)
    hi = [Message(role=Role.USER, parts=(TextPart("hi"),))]
    for name in ("chat_template", "tokenize", "messages", "tools", "add_generation_prompt"):
        with pytest.raises(InvalidRequest, match=name):
            template.render(hi, (), kwargs={name: "{{ 'x' }}"})
    assert {"chat_template", "tokenize", "conversation"} <= reserved_kwargs(tokenizer)
    with pytest.raises(ValueError, match="chat_template"):
        ChatTemplate(tokenizer, template_kwargs={"chat_template": "x"})
    _, text = template.render(hi, (), kwargs={"enable_thinking": False})
    assert text == tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}],
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=False,
    )
