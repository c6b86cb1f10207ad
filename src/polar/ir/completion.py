"""What an engine produces: a stream of events, and the completion they add up to.

An engine call yields, in order: at most one ``PromptTokens`` (engine-rendered
mode: the ids the engine's chat template produced), any number of ``Delta``s
(each carries the sampled token ids of one step, their logprobs and the parsed
text / reasoning / tool-call pieces they decoded to), and exactly one ``Finish``
when the engine ended the turn normally.
"""

from __future__ import annotations

import itertools
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


def joined(events: list[EngineEvent]) -> list[EngineEvent]:
    """The same events with each run of adjacent deltas joined into one (ids,
    logprobs, text, reasoning, tool-call pieces and details concatenated in
    order); prompt ids and the finish stay where they are.

    Engines join what one network read brought: an engine under load sends
    several steps at once, and every layer above (parse, record, encode, write)
    then handles them in one pass instead of one per step. Nothing waits for
    more to arrive, so no delta is held back. Deltas with per-token detail are
    not joined to deltas without (the detail would stop being parallel to the ids).
    """
    if len(events) < 2:
        return events
    out: list[EngineEvent] = []
    run: list[Delta] = []
    for event in events:
        if isinstance(event, Delta):
            if run and (run[0].details is None) != (event.details is None):
                out.append(_join(run))
                run = []
            run.append(event)
            continue
        if run:
            out.append(_join(run))
            run = []
        out.append(event)
    if run:
        out.append(_join(run))
    return out


def _join(run: list[Delta]) -> Delta:
    if len(run) == 1:
        return run[0]
    chain = itertools.chain.from_iterable
    return Delta(
        token_ids=tuple(chain(d.token_ids for d in run)),
        logprobs=tuple(chain(d.logprobs for d in run)),
        text="".join([d.text for d in run]),
        reasoning="".join([d.reasoning for d in run]),
        tool_calls=tuple(chain(d.tool_calls for d in run)),
        details=(None if run[0].details is None else tuple(chain(d.details or () for d in run))),
    )


@dataclass(frozen=True, slots=True)
class Completion:
    """A finished call as a non-streaming reply shows it: the message and how it
    ended (ids and logprobs are in its record)."""

    finish_reason: FinishReason
    message: Message
    usage: Usage
    matched_stop: str | int | None = None
