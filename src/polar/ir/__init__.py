"""Shared frozen types of Polar: messages, engine events, completions and records.

This module is the leaf of the import graph: it imports nothing from the rest of
the project, and nothing here knows about HTTP, pydantic wire models or torch.
"""

from polar.ir.completion import (
    Completion,
    Delta,
    EngineEvent,
    Finish,
    FinishReason,
    PromptTokens,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    Usage,
)
from polar.ir.messages import (
    ChatRequest,
    ImagePart,
    JsonObject,
    Message,
    Part,
    ReasoningPart,
    Role,
    Sampling,
    TextPart,
    ToolCall,
    ToolChoice,
    ToolChoiceMode,
    ToolSpec,
)
from polar.ir.records import (
    CallError,
    CaptureMode,
    CompletionRecord,
    Dialect,
    ErrorKind,
    RecordStatus,
    Timings,
)

__all__ = [
    "CallError",
    "CaptureMode",
    "ChatRequest",
    "Completion",
    "CompletionRecord",
    "Delta",
    "Dialect",
    "EngineEvent",
    "ErrorKind",
    "Finish",
    "FinishReason",
    "ImagePart",
    "JsonObject",
    "Message",
    "Part",
    "PromptTokens",
    "ReasoningPart",
    "RecordStatus",
    "Role",
    "Sampling",
    "TextPart",
    "Timings",
    "TokenLogprob",
    "ToolCall",
    "ToolCallDelta",
    "ToolChoice",
    "ToolChoiceMode",
    "ToolSpec",
    "TopLogprob",
    "Usage",
]
