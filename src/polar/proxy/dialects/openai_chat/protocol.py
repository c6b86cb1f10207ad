"""Wire models of OpenAI Chat Completions requests, field for field.

Only requests are validated with pydantic (they come from outside). Replies
are built as plain dicts in :mod:`.translate` and :mod:`.stream` (typed below
as ``TypedDict``s) because they are on the hot path.

Fields are those of OpenAI's API reference, plus the vLLM/SGLang extensions
harnesses commonly send (``reasoning_content``/``reasoning`` on assistant
messages, ``top_k``, ``min_p``, ``repetition_penalty``,
``chat_template_kwargs``). Anything else is accepted and reported once.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class ImageURL(_Wire):
    url: str
    detail: str | None = None


class ContentPart(_Wire):
    """One content part. ``type`` is checked in translation so an unsupported
    kind gets an error naming it rather than a generic validation message."""

    type: str
    text: str | None = None
    image_url: ImageURL | None = None
    refusal: str | None = None


class FunctionCall(_Wire):
    name: str
    # OpenAI sends a JSON string; some clients send the object itself.
    arguments: str | dict[str, Any] = ""


class MessageToolCall(_Wire):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Wire):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None
    # Reasoning of earlier assistant turns, as vLLM/SGLang/DeepSeek spell it.
    reasoning_content: str | None = None
    reasoning: str | None = None


class FunctionDef(_Wire):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(_Wire):
    type: str
    function: FunctionDef | None = None


class NamedFunction(_Wire):
    name: str


class NamedToolChoice(_Wire):
    type: str
    function: NamedFunction | None = None


class StreamOptions(_Wire):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


class ChatCompletionRequest(_Wire):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    stop: str | list[str] | None = None
    n: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    seed: int | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    # vLLM / SGLang extensions
    top_k: int | None = None
    min_p: float | None = Field(default=None, ge=0, le=1)
    repetition_penalty: float | None = Field(default=None, gt=0)
    chat_template_kwargs: dict[str, Any] | None = None
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None


# Fields the gateway accepts but does not act on; clients send them routinely,
# so they are not reported as unknown.
IGNORED_FIELDS = frozenset({"user", "metadata", "store", "stream_options"})


# ---------------------------------------------------------------- replies


class WireFunction(TypedDict, total=False):
    name: str
    arguments: str


class WireToolCall(TypedDict, total=False):
    index: int
    id: str
    type: Literal["function"]
    function: WireFunction


class WireTopLogprob(TypedDict):
    token: str
    logprob: float
    bytes: list[int] | None


class WireTokenLogprob(TypedDict):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[WireTopLogprob]


class WireUsage(TypedDict, total=False):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int]
    completion_tokens_details: dict[str, int]
