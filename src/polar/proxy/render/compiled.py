"""A tokenizer's chat template, rendered as ``apply_chat_template`` renders it,
without that wrapper's cost on every call.

``tokenizer.apply_chat_template(messages, tools=..., tokenize=False,
add_generation_prompt=...)`` (transformers 5) does, per call, what this does:

- picks the template (a tokenizer may hold several, ``tool_use`` for calls with
  tools): here picked once for calls with tools and once for calls without;
- drops each message's keys whose value is ``None``: the same;
- rebuilds every input out of plain JSON types (a deep copy that keeps rich
  objects away from the sandbox): skipped. What the gateway renders is plain
  JSON already (:func:`~polar.proxy.render.template.template_message`, the
  request's tools and ``chat_template_kwargs``, all parsed from JSON), so the
  copy would equal its input;
- copies a message's reasoning to ``thinking`` (gpt-oss templates read that):
  the same;
- adds the special tokens (``eos_token``, ...) under the caller's kwargs: read
  once;
- renders with transformers' own compiled environment (its sandbox, filters,
  globals and extensions): here an overlay of that environment, whose sandbox
  remembers its attribute decisions. Jinja's immutable sandbox decides whether
  ``obj.attr`` may be read from ``type(obj)`` and the name alone, so
  remembering them per (type, name) is exact. And ``message.role`` on a plain
  dict goes straight to the item when no dict has an attribute of that name,
  where the sandbox would first try the attribute and catch its
  ``AttributeError`` (the same result, without the exception).

About 74 us become 33 us for a two-message conversation (Qwen3's template):
most of a small token-in/token-out call's rendering. A template whose output
differs from ``apply_chat_template`` on the probe conversations (a newer
transformers doing something more per call, say) is not used:
:func:`compiled_template` returns ``None`` and the caller keeps the wrapper.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from polar.tokenizer import Tokenizer

log = logging.getLogger(__name__)

# The most attribute decisions remembered: a template reads a few dozen.
_DECISIONS = 4096

# What ``getattr`` finds on a plain dict: its type's names (a dict has no instance ones).
_DICT_ATTRIBUTES = frozenset(dir(dict))

# Names the render itself passes, and apply_chat_template's own parameters: a
# request's chat_template_kwargs may not set them (one named ``chat_template``
# would replace the model's template with the client's).
RENDER_NAMES = frozenset(
    {
        "messages",
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
        "sanitize_control_tokens",
    }
)


def reserved_kwargs(tokenizer: Tokenizer) -> frozenset[str]:
    """Template kwargs a caller may not set: the render's own names and every
    named parameter of the tokenizer's ``apply_chat_template``."""
    names = set(RENDER_NAMES)
    apply = getattr(tokenizer, "apply_chat_template", None)
    if apply is not None:
        try:
            params = inspect.signature(apply).parameters.values()
        except (TypeError, ValueError):
            params = ()  # type: ignore[assignment]
        names.update(p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL))
    return frozenset(names)


# Names a message's reasoning may come under; the first is the one templates read.
_REASONING = ("reasoning_content", "thinking", "reasoning")


def _aliased(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` without its ``None`` values, its reasoning also under
    ``thinking``, as apply_chat_template hands it to the template."""
    plain = {k: v for k, v in message.items() if v is not None}
    for name in _REASONING:
        reasoning = plain.get(name)
        if reasoning is not None:
            return {"thinking": reasoning, **plain, "reasoning_content": reasoning}
    return plain


class CompiledTemplate:
    """One tokenizer's chat template, compiled for rendering (see the module)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        compile_template: Callable[[str], Any],
    ) -> None:
        self._special = dict(tokenizer.special_tokens_map)
        self._without_tools = self._compiled(
            compile_template, tokenizer.get_chat_template(None, None)
        )
        with_tools = tokenizer.get_chat_template(None, [{}])
        self._with_tools = (
            self._without_tools
            if with_tools == tokenizer.get_chat_template(None, None)
            else self._compiled(compile_template, with_tools)
        )

    @staticmethod
    def _compiled(compile_template: Callable[[str], Any], source: str) -> Any:
        env = compile_template(source).environment.overlay()
        decide = env.is_safe_attribute
        decided: dict[tuple[type, str], bool] = {}

        def is_safe_attribute(obj: Any, attr: str, value: Any) -> bool:
            key = (type(obj), attr)
            safe = decided.get(key)
            if safe is None:
                safe = bool(decide(obj, attr, value))
                if len(decided) < _DECISIONS:
                    decided[key] = safe
            return safe

        read = env.getattr
        undefined = env.undefined

        def getattr_(obj: Any, attribute: str) -> Any:
            # ``message.role`` on a plain dict: the sandbox first tries the
            # attribute, which raises AttributeError (the costly part), then
            # the item. A name no dict has goes straight to the item.
            if type(obj) is dict and attribute not in _DICT_ATTRIBUTES:
                try:
                    return obj[attribute]
                except KeyError:
                    return undefined(obj=obj, name=attribute)
            return read(obj, attribute)

        env.is_safe_attribute = is_safe_attribute
        env.getattr = getattr_
        return env.from_string(source)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool,
        kwargs: Mapping[str, Any],
    ) -> str:
        if not messages:
            raise ValueError(
                "Cannot apply chat template to an empty conversation. Provide at least one message."
            )
        template = self._without_tools if tools is None else self._with_tools
        return str(
            template.render(
                messages=[_aliased(dict(m)) for m in messages],
                tools=tools,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **{**self._special, **kwargs},
            )
        )


def _probes() -> list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None, bool]]:
    """Conversations both ways must render alike: every role, reasoning, tool
    calls and results, with tools and without, with a generation prompt and without."""
    tool = {
        "type": "function",
        "function": {
            "name": "shell",
            "description": "Run a command.",
            "parameters": {
                "type": "object",
                "properties": {"cmd": {"type": "string", "description": "what to run"}},
                "required": ["cmd"],
            },
        },
    }
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "shell", "arguments": {"cmd": "ls"}},
    }
    chat: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": 'List the files.\n<b>&amp;</b> "quoted" é'},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "I should look.",
            "tool_calls": [call],
        },
        {"role": "tool", "content": "a.py\nb.py", "tool_call_id": "call_1", "name": "shell"},
        {"role": "assistant", "content": "Two files.", "reasoning_content": "Done."},
        {"role": "user", "content": "Thanks."},
    ]
    return [
        (chat[:2], None, True),
        (chat[1:2], [tool], True),
        (chat, [tool], True),
        (chat, None, False),
        (chat[:5], [tool], False),
    ]


def compiled_template(tokenizer: Tokenizer) -> CompiledTemplate | None:
    """The tokenizer's template compiled, or ``None`` when that cannot be done
    exactly here (no template, transformers without the pieces this relies on,
    or a render that differs from ``apply_chat_template`` on the probes)."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:
        return None
    if getattr(tokenizer, "chat_template", None) is None or not hasattr(
        tokenizer, "get_chat_template"
    ):
        return None
    try:
        compiled = CompiledTemplate(tokenizer, _compile_jinja_template)
    except Exception as exc:  # any surprise in transformers' internals: keep the wrapper
        log.warning("chat template: rendering through apply_chat_template (%s)", exc)
        return None
    for messages, tools, generation in _probes():
        expected = _outcome(
            tokenizer.apply_chat_template,
            messages,
            tools=tools,
            tokenize=False,
            add_generation_prompt=generation,
        )
        got = _outcome(
            compiled.render, messages, tools, add_generation_prompt=generation, kwargs={}
        )
        if got != expected:
            log.warning(
                "chat template: rendering through apply_chat_template "
                "(the compiled template differs on a probe conversation)"
            )
            return None
    return compiled


def _outcome(render: Callable[..., object], *args: Any, **kwargs: Any) -> tuple[str, str]:
    """A render's text, or the type of what it raised (a template may refuse a probe)."""
    try:
        return ("text", str(render(*args, **kwargs)))
    except Exception as exc:
        return ("raised", type(exc).__name__)
