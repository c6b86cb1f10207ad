"""The model's chat template, applied by the gateway.

Messages are handed to the template the way vLLM hands them (text parts joined
with newlines, assistant tool-call arguments parsed to objects, reasoning as
``reasoning_content``, tools as ``{"type", "function": {"name",
"description", "parameters"}}``), so the gateway renders what vLLM's own chat
route would render for the same request.

:meth:`ChatTemplate.continuation` renders only what the template emits *after*
a given assistant turn: the splice needs that, and rendering only the new
messages keeps a call's cost proportional to what is new in it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, assert_never

from polar.ir import (
    ImagePart,
    JsonObject,
    Message,
    ReasoningPart,
    Role,
    TextPart,
    ToolCall,
    ToolSpec,
)
from polar.proxy.errors import InvalidRequest, UnsupportedContent
from polar.proxy.render.compiled import compiled_template, reserved_kwargs
from polar.proxy.render.tokens import TokenText
from polar.proxy.render.toolprompt import ToolPrompt, hermes_messages
from polar.tokenizer import Tokenizer

# A string no harness sends: it stands in for the assistant turn whose raw
# tokens are spliced, so the template's text after that turn can be cut out.
_MARKER = "\x00polar-splice-marker\x00"

# Offered to a template to see whether it writes tools into the prompt.
_PROBE_TOOLS = (
    ToolSpec(
        name="shell",
        description="Run a shell command.",
        parameters={"type": "object", "properties": {"cmd": {"type": "string"}}},
    ),
)


def template_message(message: Message) -> dict[str, Any]:
    role = Role.SYSTEM if message.role is Role.DEVELOPER else message.role
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for part in message.parts:
        match part:
            case TextPart(text=text):
                texts.append(text)
            case ReasoningPart(text=text):
                reasoning.append(text)
            case ToolCall(id=call_id, name=name, arguments=arguments):
                calls.append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": _arguments(arguments)},
                    }
                )
            case ImagePart():
                raise UnsupportedContent(
                    "image content cannot be rendered by the gateway's chat template "
                    "(text-only model); use engine-rendered capture for multimodal models"
                )
            case _:
                assert_never(part)
    out: dict[str, Any] = {"role": role.value, "content": "\n".join(texts)}
    if calls:
        out["tool_calls"] = calls
    if reasoning:
        out["reasoning_content"] = "\n".join(reasoning)
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    return out


def _arguments(arguments: str) -> JsonObject:
    """Arguments as vLLM 0.32 hands them to templates: the JSON object they encode;
    empty, invalid or non-object arguments become ``{}`` (vLLM coerces them so a
    bad call in history does not fail every later turn)."""
    try:
        parsed = json.loads(arguments) if arguments else {}
    except json.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def template_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]] | None:
    """Tools as vLLM's ``FunctionDefinition`` dumps them for the template:
    ``description`` always present (``null`` when absent), ``strict`` only
    when the client set it (Codex and pi send ``"strict": false``)."""
    if not tools:
        return None
    return [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description,
                "parameters": dict(t.parameters),
                **({"strict": t.strict} if t.strict is not None else {}),
            },
        }
        for t in tools
    ]


class ChatTemplate:
    """Renders IR conversations to token ids with a Hugging Face tokenizer's template."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        template_kwargs: JsonObject | None = None,
        end_of_turn: str | None = None,
        segment_cache_bytes: int = 64 << 20,
        tool_prompt: ToolPrompt = ToolPrompt.AUTO,
    ) -> None:
        """``segment_cache_bytes``: see :meth:`TokenText.encode_prompt`.
        ``tool_prompt``: who writes tools, calls and results into the prompt
        (:mod:`~polar.proxy.render.toolprompt`); ``auto`` is resolved here, and
        :attr:`tool_prompt` says what it became."""
        self.tokenizer = tokenizer
        self.text = TokenText(tokenizer, segment_cache_bytes=segment_cache_bytes)
        self.kwargs = dict(template_kwargs or {})
        self._reserved = reserved_kwargs(tokenizer)
        if clash := sorted(self._reserved.intersection(self.kwargs)):
            raise ValueError(f"template_kwargs may not set {', '.join(clash)}")
        self._compiled = compiled_template(tokenizer)
        eot = end_of_turn or tokenizer.eos_token
        if not eot:
            raise ValueError("the tokenizer has no eos token; give end_of_turn explicitly")
        self.end_of_turn = str(eot)
        ids = self.text.encode(self.end_of_turn)
        if len(ids) != 1:
            raise ValueError(f"end of turn {self.end_of_turn!r} is not a single token: {ids}")
        self.end_of_turn_id = ids[0]
        # Whether the text after an assistant turn ever depends on the tools: found
        # out on the first continuation rendered with tools, then relied on.
        self._tools_affect_continuation: bool | None = None
        if tool_prompt is ToolPrompt.AUTO:
            tool_prompt = ToolPrompt.TEMPLATE if self._renders_tools() else ToolPrompt.HERMES
        self.tool_prompt = tool_prompt

    def _renders_tools(self) -> bool:
        """Whether the template writes the tools it is given into a conversation."""
        probe = [{"role": "user", "content": "List the files."}]
        try:
            with_tools = self._template_text(probe, template_tools(_PROBE_TOOLS), kwargs={})
            without = self._template_text(probe, None, kwargs={})
        except Exception:  # a template that refuses the probe: leave the tools to it
            return True
        return with_tools != without

    def render_text(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        kwargs: JsonObject,
        add_generation_prompt: bool = True,
    ) -> str:
        """The template's text for ``messages``: what ``apply_chat_template``
        renders (through :mod:`~polar.proxy.render.compiled` where that is exact),
        of the messages with their tools written in when :attr:`tool_prompt` is
        ``hermes`` (:func:`~polar.proxy.render.toolprompt.hermes_messages`).

        ``kwargs`` (a request's ``chat_template_kwargs``) may not name the
        render's own arguments: one named ``chat_template`` would have the
        client's template rendered in place of the model's (and a template can
        loop for hours), one named ``tokenize`` would change what comes back.
        """
        if kwargs and (clash := sorted(self._reserved.intersection(kwargs))):
            raise InvalidRequest(f"chat_template_kwargs may not set {', '.join(clash)}")
        if self.tool_prompt is ToolPrompt.HERMES:
            messages, tools = hermes_messages(messages, tools), None
        return self._template_text(
            messages, tools, kwargs=kwargs, add_generation_prompt=add_generation_prompt
        )

    def _template_text(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        kwargs: JsonObject,
        add_generation_prompt: bool = True,
    ) -> str:
        if self._compiled is not None:
            return self._compiled.render(
                messages,
                tools,
                add_generation_prompt=add_generation_prompt,
                kwargs={**self.kwargs, **kwargs} if kwargs else self.kwargs,
            )
        return str(
            self.tokenizer.apply_chat_template(
                list(messages),
                tools=tools,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                **{**self.kwargs, **kwargs},
            )
        )

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        *,
        kwargs: JsonObject,
        most: int | None = None,
    ) -> tuple[list[int], str]:
        """The whole prompt (with generation prompt): ids, and the text they encode.
        ``most``: more ids than this raise
        :class:`~polar.proxy.render.tokenbound.TooManyTokens`, found out early."""
        text = self.render_text(
            [template_message(m) for m in messages], template_tools(tools), kwargs=kwargs
        )
        return self.text.encode_prompt(text, most=most), text

    def continuation(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        after: int,
        *,
        kwargs: JsonObject,
        incremental: bool = True,
        most: int | None = None,
    ) -> tuple[list[int], str]:
        """What the template emits after assistant message ``after``, up to and
        including the generation prompt: ids, and their text (``most``: as for
        :meth:`render`).

        Starts right after that turn's end-of-turn token (a special token, so
        the text tokenizes the same on its own as within the whole prompt).
        ``incremental`` renders only the marker turn and the messages after it;
        that is exact unless the template looks further back, which for the
        templates seen so far only happens for later assistant turns (reasoning
        kept or dropped relative to the last user query), so those fall back
        to rendering everything.
        """
        tail = list(messages[after + 1 :])
        marker = {"role": "assistant", "content": _MARKER}
        rendered_tools = template_tools(tools)
        rest = None
        if incremental and not any(m.role is Role.ASSISTANT for m in tail):
            reduced = [marker, *(template_message(m) for m in tail)]
            try:
                if rendered_tools and self._tools_affect_continuation is None:
                    with_tools = self._after_marker(
                        self.render_text(reduced, rendered_tools, kwargs=kwargs)
                    )
                    without = self._after_marker(self.render_text(reduced, None, kwargs=kwargs))
                    self._tools_affect_continuation = with_tools != without
                    rest = with_tools
                else:
                    # Tools render before the marker (in a system header): skip them.
                    use = rendered_tools if self._tools_affect_continuation else None
                    rest = self._after_marker(self.render_text(reduced, use, kwargs=kwargs))
            except Exception:  # a template that insists on a user turn first, say
                rest = None
        if rest is None:
            converted = [template_message(m) for m in messages]
            converted[after] = marker
            rest = self._after_marker(self.render_text(converted, rendered_tools, kwargs=kwargs))
        return self.text.bound.encode(rest, most), rest

    def _after_marker(self, text: str) -> str:
        start = text.index(_MARKER)
        end = text.find(self.end_of_turn, start)
        if end < 0:
            raise ValueError("the chat template does not end assistant turns with its eos token")
        return text[end + len(self.end_of_turn) :]
