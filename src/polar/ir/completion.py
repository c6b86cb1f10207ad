"""What an engine produces: a stream of events, and the completion they add up to.

An engine call yields, in order: at most one ``PromptTokens`` (engine-rendered
mode: the ids the engine's chat template produced), any number of ``Delta``s
(each carries the sampled token ids of one step, their logprobs and the parsed
text / reasoning / tool-call pieces they decoded to), and exactly one ``Finish``
when the engine ended the turn normally.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from polar.ir.messages import Message


class FinishReason(StrEnum):
    STOP = "stop"
    LENGTH = "length"
    TOOL_CALLS = "tool_calls"
    CONTENT_FILTER = "content_filter"
    ABORT = "abort"


@dataclass(frozen=True, slots=True)
class TopLogprob:
    token: str
    logprob: float
    bytes: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """Client-facing detail of one sampled token (only kept when a client asked for logprobs)."""

    token: str
    logprob: float
    bytes: tuple[int, ...] | None = None
    top: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of a streamed tool call. ``id``/``name`` come once, with the first piece.

    ``discard`` withdraws call ``index`` (it turned out malformed after it began
    streaming; its text follows as message text). Wire formats that cannot
    withdraw a streamed call ignore it; the recorded message honours it.
    """

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""
    discard: bool = False


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class PromptTokens:
    ids: tuple[int, ...]
    kind: Literal["prompt"] = "prompt"


@dataclass(frozen=True, slots=True)
class Delta:
    """One step of generation.

    ``token_ids`` and ``logprobs`` are parallel; ``details`` is parallel to them
    too when the engine reported per-token detail (for clients that asked).
    """

    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    text: str = ""
    reasoning: str = ""
    tool_calls: tuple[ToolCallDelta, ...] = ()
    details: tuple[TokenLogprob, ...] | None = None
    kind: Literal["delta"] = "delta"


@dataclass(frozen=True, slots=True)
class Finish:
    reason: FinishReason
    usage: Usage
    # The stop string or token that ended generation, when the engine says.
    matched_stop: str | int | None = None
    message: Message | None = None
    """The whole assistant message: set by the gateway's relay on the last event
    it yields (the message it records), never by an engine."""
    kind: Literal["finish"] = "finish"


EngineEvent = PromptTokens | Delta | Finish


@dataclass(frozen=True, slots=True)
class Completion:
    """A finished call as a non-streaming reply shows it: the message and how it
    ended (ids and logprobs are in its record)."""

    finish_reason: FinishReason
    message: Message
    usage: Usage
    matched_stop: str | int | None = None
