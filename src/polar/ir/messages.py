"""Provider-neutral chat messages and requests.

Every dialect translates its wire format into these types and back, and every
engine consumes them. They are frozen: a request is a value, not a builder.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

JsonObject = Mapping[str, Any]
"""A decoded JSON object. Used for opaque payloads such as tool schemas."""

# Every IR value has an ``extra`` mapping: wire attributes a dialect keeps so
# it can write the value back exactly as it came (``cache_control``, item ids,
# whether content was a string or a list of blocks...). Nothing in the gateway
# branches on ``extra``; what the gateway acts on is a typed field.


class Role(StrEnum):
    SYSTEM = "system"
    DEVELOPER = "developer"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


@dataclass(frozen=True, slots=True)
class TextPart:
    text: str
    extra: JsonObject = field(default_factory=dict)
    kind: Literal["text"] = "text"


@dataclass(frozen=True, slots=True)
class ImagePart:
    """An image given by URL (``https:`` or a ``data:`` URL)."""

    url: str
    detail: str | None = None
    extra: JsonObject = field(default_factory=dict)
    kind: Literal["image"] = "image"


@dataclass(frozen=True, slots=True)
class ReasoningPart:
    """Model reasoning (a ``<think>`` block for Qwen3).

    ``signature`` is an opaque token some dialects require to round-trip
    reasoning (Anthropic thinking signatures, Responses ``encrypted_content``).
    """

    text: str
    signature: str | None = None
    extra: JsonObject = field(default_factory=dict)
    kind: Literal["reasoning"] = "reasoning"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call the assistant made. ``arguments`` is the JSON text exactly as produced or sent."""

    id: str
    name: str
    arguments: str
    extra: JsonObject = field(default_factory=dict)
    kind: Literal["tool_call"] = "tool_call"


Part = TextPart | ImagePart | ReasoningPart | ToolCall


@dataclass(frozen=True, slots=True)
class Message:
    """One conversation turn.

    A tool result is a message with ``role=TOOL`` and ``tool_call_id`` set;
    ``is_error`` marks a result the harness flagged as a failure.
    """

    role: Role
    parts: tuple[Part, ...] = ()
    name: str | None = None
    tool_call_id: str | None = None
    is_error: bool = False
    extra: JsonObject = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The text parts joined with newlines (how chat templates see list content)."""
        return "\n".join(p.text for p in self.parts if isinstance(p, TextPart))

    @property
    def reasoning(self) -> str | None:
        pieces = [p.text for p in self.parts if isinstance(p, ReasoningPart)]
        return "\n".join(pieces) if pieces else None

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        return tuple(p for p in self.parts if isinstance(p, ToolCall))

    @property
    def images(self) -> tuple[ImagePart, ...]:
        return tuple(p for p in self.parts if isinstance(p, ImagePart))

    def preview(self, max_chars: int = 300) -> str:
        """One line for people: the reasoning, text and tool calls, each JSON-quoted
        and cut to ``max_chars`` characters (``polar records``, the dashboard)."""

        def quoted(text: str) -> str:
            cut = text if len(text) <= max_chars else text[:max_chars] + "..."
            return json.dumps(cut, ensure_ascii=False)

        parts = []
        if self.reasoning:
            parts.append(f"reasoning={quoted(self.reasoning)}")
        if self.text:
            parts.append(f"text={quoted(self.text)}")
        parts += [f"tool_call={call.name}({quoted(call.arguments)})" for call in self.tool_calls]
        return " ".join(parts)


class ToolKind(StrEnum):
    FUNCTION = "function"
    """Called with JSON arguments matching ``parameters``."""
    CUSTOM = "custom"
    """Called with free-form text (OpenAI Responses ``custom`` tools); the model
    sees one string parameter, ``input``."""


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool offered to the model. ``parameters`` is its JSON schema.

    ``namespace`` is the group it was offered in (OpenAI Responses ``namespace``
    tools); calls to it are reported with that namespace.
    """

    name: str
    description: str | None = None
    parameters: JsonObject = field(default_factory=dict)
    strict: bool | None = None
    kind: ToolKind = ToolKind.FUNCTION
    namespace: str | None = None
    extra: JsonObject = field(default_factory=dict)


class ToolChoiceMode(StrEnum):
    AUTO = "auto"
    NONE = "none"
    REQUIRED = "required"
    NAMED = "named"


@dataclass(frozen=True, slots=True)
class ToolChoice:
    mode: ToolChoiceMode
    name: str | None = None


@dataclass(frozen=True, slots=True)
class Sampling:
    """Sampling parameters. ``None`` means "the engine's default"."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logit_bias: Mapping[int, float] = field(default_factory=dict)


class EditKind(StrEnum):
    """Changes the gateway made to a request before rendering it."""

    STRIPPED_BILLING_HEADER = "stripped_billing_header"
    """Claude Code's per-request ``x-anthropic-billing-header`` system block,
    which changes every call and would break token prefixes."""

    DEFAULTED_MAX_TOKENS = "defaulted_max_tokens"
    """No output limit was asked: the gateway set the rest of the context (or
    the configured default), not the engine's 16-token default."""

    CLAMPED_MAX_TOKENS = "clamped_max_tokens"
    """The limit asked was more than the context leaves after the prompt."""

    ENFORCED_SAMPLING = "enforced_sampling"
    """The session's sampling policy replaced what the harness asked (temperature,
    top-p, top-k, min-p; penalties, logit bias and seed dropped)."""


@dataclass(frozen=True, slots=True)
class RequestEdit:
    kind: EditKind
    detail: str


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A chat call as the harness meant it, independent of its dialect.

    ``top_logprobs`` is what the *client* asked to see (``None``: no logprobs);
    the gateway always asks the engine for the sampled tokens' logprobs anyway.
    """

    model: str
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    sampling: Sampling = Sampling()
    stream: bool = False
    include_usage: bool = False
    top_logprobs: int | None = None
    template_kwargs: JsonObject = field(default_factory=dict)
    response_format: JsonObject | None = None
    """OpenAI ``response_format`` (JSON mode / JSON schema), passed to engines that honour it."""
    structured_output: JsonObject | None = None
    """vLLM-style ``structured_outputs`` constraint (``{"regex": ...}``, ``{"json": ...}``...)."""
    edits: tuple[RequestEdit, ...] = ()
    encrypted_reasoning: bool = False
    """The client wants each reasoning part back as an opaque payload it replays
    on its next call (Responses ``include: ["reasoning.encrypted_content"]``)."""
    extra: JsonObject = field(default_factory=dict)
