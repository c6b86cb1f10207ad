"""Wire models of Gemini API requests (``v1beta``), field for field.

The model is named by the path (``/v1beta/models/{model}:generateContent``);
the route puts it in the body as the ``model`` field of Google's
``GenerateContentRequest`` (``models/{model}``), so the record keeps the name
the client asked for. Parts are kept as plain mappings here and checked part
by part in :mod:`.translate`, so an unsupported part gets an error naming its
kind and position. Fields beyond the documented ones are accepted, carried
through unchanged, and reported once.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class Content(_Wire):
    parts: list[dict[str, Any]]
    role: str | None = None


class FunctionDeclaration(_Wire):
    name: str = Field(min_length=1)
    description: str | None = None
    behavior: str | None = None
    parameters: dict[str, Any] | None = None
    """An OpenAPI-style ``Schema`` (upper-case ``type`` values)."""
    parametersJsonSchema: dict[str, Any] | None = None
    """A JSON Schema; what the Gemini CLI sends."""
    response: dict[str, Any] | None = None
    responseJsonSchema: Any = None


class Tool(_Wire):
    functionDeclarations: list[FunctionDeclaration] | None = None


class FunctionCallingConfig(_Wire):
    mode: Literal["MODE_UNSPECIFIED", "AUTO", "ANY", "NONE", "VALIDATED"] | None = None
    allowedFunctionNames: list[str] | None = None


class ToolConfig(_Wire):
    functionCallingConfig: FunctionCallingConfig | None = None


class ThinkingConfig(_Wire):
    includeThoughts: bool | None = None
    thinkingBudget: int | None = None
    thinkingLevel: str | None = None


class GenerationConfig(_Wire):
    stopSequences: list[str] | None = None
    responseMimeType: str | None = None
    responseSchema: dict[str, Any] | None = None
    responseJsonSchema: dict[str, Any] | None = None
    responseModalities: list[str] | None = None
    candidateCount: int | None = Field(default=None, ge=1)
    maxOutputTokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    topP: float | None = Field(default=None, ge=0, le=1)
    topK: int | None = Field(default=None, ge=0)
    seed: int | None = None
    presencePenalty: float | None = None
    frequencyPenalty: float | None = None
    responseLogprobs: bool | None = None
    logprobs: int | None = Field(default=None, ge=0, le=20)
    thinkingConfig: ThinkingConfig | None = None


class GenerateContentRequest(_Wire):
    model: str
    contents: list[Content] = Field(min_length=1)
    tools: list[Tool] | None = None
    toolConfig: ToolConfig | None = None
    safetySettings: list[dict[str, Any]] | None = None
    systemInstruction: Content | None = None
    generationConfig: GenerationConfig | None = None
    cachedContent: str | None = None


class CountTokensRequest(_Wire):
    model: str
    contents: list[Content] | None = None
    generateContentRequest: dict[str, Any] | None = None


PATH_PREFIXES = ("/v1beta/models/", "/v1/models/")
"""Where the Gemini API's model methods live: ``{prefix}{model}:{method}``."""
METHODS = ("generateContent", "streamGenerateContent", "countTokens")

# Top-level fields the gateway carries but does not act on; not reported as unknown.
KNOWN_EXTRAS = frozenset({"labels"})

ERROR_STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "INVALID_ARGUMENT",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
"""HTTP status -> Google's canonical status name, as the API's error bodies carry it."""
