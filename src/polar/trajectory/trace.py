"""What builders produce: traces, the trajectory of a session, and its accounting.

A **trace** is one token stream a trainer consumes: ``prompt_ids`` (never
trained) followed by ``response_ids``, where ``loss_mask`` is 1 exactly on the
tokens the policy sampled and 0 on everything in between (tool output, user
turns, template glue). ``response_logprobs`` holds the engine's logprob of
each sampled token, with ``logprob_mask`` saying which entries are real (a
sampled token whose logprob the engine did not report, or reported as
non-finite, keeps ``loss_mask`` 1 and gets ``logprob_mask`` 0; interstitial
entries are 0.0 with mask 0). ``turns`` names the record each span came from.

A **trajectory** is everything built from one session: its traces, the chains
they came from, how every generated token of the session was used
(:class:`Accounting`) and how each call's prompt relates to the one before it
(:class:`TurnDrift`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType

from polar.ir import (
    CaptureMode,
    DeliveryIssue,
    Distribution,
    FinishReason,
    PromptOrigin,
    Unreproducible,
)


class ChainClass(StrEnum):
    """What a chain of calls is, found from its structure (see :mod:`polar.trajectory.classify`)."""

    MAIN = "main"
    """The agent's own conversation."""
    SUB_AGENT = "sub_agent"
    """Another agentic conversation of the session (a delegated task)."""
    SIDE_CALL = "side_call"
    """A one-off call the harness makes for itself: a title, a summary, a memory note."""
    COMPACTION_RESTART = "compaction_restart"
    """The main conversation started over with a shorter history (context compaction)."""


class Relation(StrEnum):
    """How a call's prompt relates to the earlier call it continues (its parent)."""

    FRESH = "fresh"
    """No earlier call's prompt is a prefix of it: a chain starts here."""
    EXTENDS = "extends"
    """Parent prompt + parent's sampled tokens + new tokens, token for token."""
    CLOSED = "closed"
    """As ``extends``; the parent's turn had no end-of-turn token (cut at the length
    limit or a stop string) and the new tokens begin with the one the template added."""
    REWRITTEN = "rewritten"
    """Parent prompt, then tokens other than the parent's sampled ones: the template
    or the harness re-rendered that turn (dropped reasoning, re-serialized arguments)."""
    RETRY = "retry"
    """The parent's prompt again, unchanged: the harness re-sent the same call."""
    DROPPED_TURN = "dropped_turn"
    """The parent's prompt without its generation prompt, then other turns: the
    harness dropped the parent's reply (say an empty or truncated one) and went on."""
    EDITED = "edited"
    """Shares the parent's history past its first turn, then differs inside it: the
    harness edited or removed earlier messages."""
    RESTARTED = "restarted"
    """Shares an earlier call's first turn and more, but is much shorter than it: the
    conversation restarted with a compacted history. A chain starts here."""


class BreakReason(StrEnum):
    """Why a chain's tokens continue in a new trace instead of the current one."""

    REWRITTEN = "rewritten"
    RETRY = "retry"
    DROPPED_TURN = "dropped_turn"
    EDITED = "edited"
    POLICY_CHANGED = "policy_changed"
    """The call was sampled by another policy version than the one before it."""
    SAMPLING_CHANGED = "sampling_changed"
    """The call was sampled from another distribution (temperature, top-p, ...)
    than the one before it, or one of them from none a trainer can reproduce."""


BREAKING = {
    Relation.REWRITTEN: BreakReason.REWRITTEN,
    Relation.RETRY: BreakReason.RETRY,
    Relation.DROPPED_TURN: BreakReason.DROPPED_TURN,
    Relation.EDITED: BreakReason.EDITED,
}
"""Relations that break a trace; ``extends`` and ``closed`` continue it."""


class Fate(StrEnum):
    """What became of a record's generated tokens. Every reason but ``delivered`` is a
    quarantine: the tokens are counted, and kept out of training."""

    DELIVERED = "delivered"
    """Sampled tokens with loss mask 1 in a trainable trace."""
    CLASS_NOT_TRAINED = "class_not_trained"
    """In a trace whose chain class is not trained (side calls, by default)."""
    FAILED_CALL = "failed_call"
    """The engine call failed; any partial output never became part of a conversation."""
    ABORTED_CALL = "aborted_call"
    """The client went away mid-turn; the partial output was never used."""
    INTERRUPTED_CALL = "interrupted_call"
    """The gateway died while the call was in flight; nothing of it reached a client."""
    IN_FLIGHT_CALL = "in_flight_call"
    """The call had not finished when the session was read (a build that did not
    wait for the session's calls to settle)."""
    SUPERSEDED_ATTEMPT = "superseded_attempt"
    """A completed attempt of a call the gateway completed again in a later attempt."""
    NO_PROMPT_IDS = "no_prompt_ids"
    """Output without the prompt ids it was sampled from: nothing to condition on."""


@dataclass(frozen=True, slots=True)
class TurnSpan:
    """Where one record's tokens sit in a trace's ``response_ids``.

    ``[start, sampled_start)`` are the interstitial tokens before it (mask 0;
    empty for a trace's first record) and ``[sampled_start, end)`` its sampled
    tokens (mask 1).
    """

    record: str
    start: int
    sampled_start: int
    end: int


@dataclass(frozen=True, slots=True)
class Trace:
    """One trainer sample (see the module docstring for the token fields)."""

    session_id: str
    chain: int
    """Index of the chain in ``Trajectory.chains``."""
    segment: int
    """Position of this trace among its chain's traces."""
    chain_class: ChainClass
    trainable: bool
    break_reason: BreakReason | None
    """Why the chain continues here rather than in the trace before (``None``: first)."""
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    response_logprobs: tuple[float, ...]
    logprob_mask: tuple[int, ...]
    turns: tuple[TurnSpan, ...]
    finish_reason: FinishReason | None
    policy_version: int
    reward_scale: float
    """What the session's outcome reward is multiplied by for this trace (class policy)."""
    reward: float | None = None
    """``outcome * reward_scale`` once the session is scored (``Trajectory.with_reward``)."""
    truncated_turns: int = 0
    """Turns of this trace cut short (length limit, or aborted by the engine)."""
    malformed_tool_calls: int = 0
    sampling: Distribution | Unreproducible = Unreproducible.UNRECORDED
    """The distribution every sampled token of the trace was drawn from and whose
    logprobs ``response_logprobs`` are (one per trace: a change breaks the chain),
    or why a trainer cannot reproduce it (:func:`polar.ir.distribution_of`)."""

    @property
    def id(self) -> str:
        return f"{self.session_id}/{self.chain}.{self.segment}"

    @property
    def records(self) -> tuple[str, ...]:
        return tuple(t.record for t in self.turns)

    @property
    def tokens(self) -> int:
        """What a trainer processes for this trace: prompt and response."""
        return len(self.prompt_ids) + len(self.response_ids)


@dataclass(frozen=True, slots=True)
class Chain:
    """A conversation thread: calls whose prompts continue one another."""

    index: int
    chain_class: ChainClass
    records: tuple[str, ...]
    forked_from: str | None
    """The record of another chain whose prompt this chain's first prompt continues."""
    classified_by: str
    """The rule that gave the class (``structure: ...`` or ``rule: <pattern>``)."""


@dataclass(frozen=True, slots=True)
class TurnDrift:
    """How one call's prompt relates to the call it continues, measured in tokens,
    next to what the gateway recorded (``lineage``) when it served the call."""

    record: str
    capture: CaptureMode
    relation: Relation
    parent: str | None
    shared_tokens: int
    """Leading tokens the prompt shares with ``parent``'s prompt + sampled tokens
    (roots: with the earlier call sharing the most); drift starts at this token."""
    base_tokens: int
    """Length of that prompt + sampled tokens."""
    lineage: PromptOrigin | None
    lineage_base: str | None
    lineage_shared_tokens: int | None

    @property
    def agrees_with_lineage(self) -> bool | None:
        """Whether the gateway measured the same drift against the same call
        (``None`` when it compared with another call, or recorded nothing)."""
        if self.lineage is None or self.lineage_base is None or self.lineage_base != self.parent:
            return None
        return self.lineage_shared_tokens == self.shared_tokens


@dataclass(frozen=True, slots=True)
class RecordFate:
    record: str
    generated: int
    fate: Fate
    trace: int | None
    """Index in ``Trajectory.traces`` of the trace holding its sampled tokens."""
    missing_logprobs: int = 0


@dataclass(frozen=True, slots=True)
class Accounting:
    """Where a session's generated tokens went: ``captured == delivered + sum(quarantined)``."""

    captured: int
    delivered: int
    quarantined: Mapping[Fate, int]
    missing_logprobs: int
    """Delivered tokens without a usable rollout logprob (``logprob_mask`` 0)."""
    breaks: Mapping[BreakReason, int]
    truncated_turns: int
    records: tuple[RecordFate, ...]
    delivery_flags: Mapping[DeliveryIssue, int] = field(
        default_factory=lambda: MappingProxyType({})
    )
    """Flags on the session's records (every record, whatever its fate): where what a
    client was handed and the sampled ids disagree (engine-rendered capture)."""
    malformed_tool_calls: int = 0
    """Tool calls the model wrote that did not parse (handed to the client as text)."""
    unreproducible: Mapping[Unreproducible, int] = field(
        default_factory=lambda: MappingProxyType({})
    )
    """Delivered tokens whose sampling distribution a trainer cannot reproduce, by why
    (a trainer leaves them out of the loss)."""

    @property
    def delivered_fraction(self) -> float:
        return self.delivered / self.captured if self.captured else 1.0


@dataclass(frozen=True, slots=True)
class Trajectory:
    session_id: str
    builder: str
    traces: tuple[Trace, ...]
    chains: tuple[Chain, ...]
    accounting: Accounting
    drift: tuple[TurnDrift, ...]
    group_id: str | None = None
    outcome: float | None = None

    @property
    def delivered_fraction(self) -> float:
        return self.accounting.delivered_fraction

    @property
    def trainable(self) -> tuple[Trace, ...]:
        return tuple(t for t in self.traces if t.trainable)

    def with_reward(self, outcome: float) -> Trajectory:
        """The trajectory scored: each trace gets ``outcome`` times its class's scale."""
        traces = tuple(replace(t, reward=outcome * t.reward_scale) for t in self.traces)
        return replace(self, traces=traces, outcome=outcome)
