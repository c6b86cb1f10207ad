"""Wire models of OpenAI Responses requests, field for field.

Input items and tools stay plain mappings here and are checked one by one in
:mod:`.translate`, so an unsupported item or tool gets an error naming its
type and position. Other fields are accepted, carried through, reported once.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class ReasoningConfig(_Wire):
    effort: str | None = None
    summary: str | None = None


class ResponsesRequest(_Wire):
    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    stream: bool | None = None
    store: bool | None = None
    include: list[str] | None = None
    reasoning: ReasoningConfig | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    previous_response_id: str | None = None
    text: dict[str, Any] | None = None


# Fields the harnesses send that the gateway carries but does not act on.
KNOWN_EXTRAS = frozenset(
    {
        "prompt_cache_key",
        "client_metadata",
        "metadata",
        "user",
        "service_tier",
        "truncation",
        "safety_identifier",
        "prompt_cache_retention",
        "background",
    }
)

ENCRYPTED_REASONING = "reasoning.encrypted_content"
