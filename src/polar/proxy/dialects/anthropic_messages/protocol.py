"""Wire models of Anthropic Messages requests, field for field.

Content blocks are kept as plain mappings here and checked block by block in
:mod:`.translate`, so an unsupported block gets an error naming its type and
position rather than a generic union-validation message. Fields beyond the
documented ones (betas such as ``context_management``, ``output_config``) are
accepted, carried through unchanged, and reported once.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class WireMessage(_Wire):
    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]


class ToolDef(_Wire):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None


class ToolChoiceParam(_Wire):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingParam(_Wire):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None


class MessagesRequest(_Wire):
    model: str
    max_tokens: int = Field(ge=1)
    messages: list[WireMessage] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoiceParam | None = None
    thinking: ThinkingParam | None = None
    metadata: dict[str, Any] | None = None


class CountTokensRequest(_Wire):
    model: str
    messages: list[WireMessage] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoiceParam | None = None
    thinking: ThinkingParam | None = None


# Top-level fields Claude Code and the SDKs send that the gateway carries but
# does not act on; not reported as unknown.
KNOWN_EXTRAS = frozenset(
    {
        "metadata",
        "context_management",
        "output_config",
        "service_tier",
        "container",
        "mcp_servers",
        "betas",
    }
)

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}
