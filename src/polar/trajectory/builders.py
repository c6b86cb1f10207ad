"""Builders: a session's completion records in, a :class:`Trajectory` out.

Both builders share the same reading of the session (which records take part,
parents, chains, classes: :mod:`polar.trajectory.chains`,
:mod:`polar.trajectory.classify`) and the same accounting; they differ in how
calls become traces:

* ``per_request``: one trace per call, its prompt and its sampled tokens. Every
  turn re-sends the whole history, so a trainer processes the shared prefix once
  per call.
* ``prefix_merge``: one trace per clean segment of a chain: the segment's first
  prompt, then for each call its sampled tokens (loss mask 1, the engine's
  logprobs) and, before the next call's, that call's new prompt tokens (mask 0).
  For a segment of calls ``k .. m``, ``prompt_ids + response_ids`` is exactly
  the prompt of call ``m`` plus what it sampled.

Builders are pure and synchronous: no I/O, no tokenizer loading (a
:class:`~polar.trajectory.turns.TurnFormat` and, for text rules, a ``decode``
function are passed in). Other builders are plug-ins: any ``module:attribute``
that, called with a :class:`BuildConfig`, returns an object with ``name`` and
``build``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from polar.ir import CompletionRecord, FinishReason, Unreproducible, distribution_of
from polar.plugins import load_factory
from polar.trajectory.chains import Link, form_chains, link_calls, logprobs_of, segments, select
from polar.trajectory.classify import ClassConfig, Decode, RuleClaims, classify
from polar.trajectory.errors import BuildInputError, UnknownBuilder
from polar.trajectory.trace import (
    Accounting,
    BreakReason,
    Chain,
    ChainClass,
    Fate,
    RecordFate,
    Trace,
    Trajectory,
    TurnDrift,
    TurnSpan,
)
from polar.trajectory.turns import TurnFormat


@dataclass(frozen=True, slots=True)
class BuildConfig:
    turns: TurnFormat
    classes: ClassConfig = field(default_factory=ClassConfig)
    restart_ratio: float = 0.5
    """A prompt that shares an earlier call's history but is shorter than this
    fraction of it restarts a chain (compaction) instead of editing it."""
    decode: Decode | None = None
    """Token ids to text, for class rules on decoded tokens."""


class Builder(Protocol):
    name: str

    def build(
        self, records: Iterable[CompletionRecord], *, group_id: str | None = None
    ) -> Trajectory: ...


BuilderFactory = Callable[[BuildConfig], Builder]

# Turns cut short: at the length limit, or by the engine (``abort``, e.g. for a
# weight update). The client received them, so they are delivered like any turn.
_CUT = frozenset({FinishReason.LENGTH, FinishReason.ABORT})


# ---------------------------------------------------------------- the shared reading


@dataclass(frozen=True, slots=True)
class SessionPlan:
    """A session read for building: its calls, their parents, chains and classes."""

    session_id: str
    records: tuple[CompletionRecord, ...]
    calls: tuple[CompletionRecord, ...]
    fates: Mapping[str, Fate]
    links: tuple[Link, ...]
    chains: tuple[tuple[int, ...], ...]
    chain_of: tuple[int, ...]
    classes: tuple[tuple[ChainClass, str], ...]


def plan_session(records: Iterable[CompletionRecord], config: BuildConfig) -> SessionPlan:
    ordered = sorted(records, key=lambda r: (r.seq, r.attempt))
    if not ordered:
        raise BuildInputError("no records to build from")
    calls, fates = select(ordered)
    claims = RuleClaims(config.classes, calls, config.turns, config.decode)
    links = link_calls(calls, config.turns, restart_ratio=config.restart_ratio, claim=claims)
    claimed = claims.claimed
    # A claimed call starts a chain, unless it continues a call claimed for the
    # same class (a side conversation of several calls stays one chain).
    detached = [
        i
        for i, (chain_class, _) in claimed.items()
        if (parent := links[i].parent) is None or claimed.get(parent, (None,))[0] != chain_class
    ]
    chains = form_chains(links, detached=detached)
    chain_of = [0] * len(calls)
    for k, chain in enumerate(chains):
        for i in chain:
            chain_of[i] = k
    classes = classify(chains, calls, links, config.classes, claimed)
    return SessionPlan(
        session_id=ordered[0].session_id,
        records=tuple(ordered),
        calls=tuple(calls),
        fates=MappingProxyType(fates),
        links=tuple(links),
        chains=tuple(tuple(c) for c in chains),
        chain_of=tuple(chain_of),
        classes=tuple(classes),
    )


def _trace(
    plan: SessionPlan,
    config: BuildConfig,
    chain: int,
    segment: int,
    reason: BreakReason | None,
    members: Sequence[int],
) -> Trace:
    """The trace of calls ``members`` (consecutive in a chain, clean links)."""
    calls = plan.calls
    first = calls[members[0]]
    response: list[int] = []
    loss: list[int] = []
    logprobs: list[float] = []
    valid: list[int] = []
    turns: list[TurnSpan] = []
    previous: CompletionRecord | None = None
    for i in members:
        call = calls[i]
        start = len(response)
        if previous is not None:
            # Invariant (clean link): call.prompt_ids starts with previous prompt + output.
            gap = call.prompt_ids[len(previous.prompt_ids) + len(previous.output_ids) :]
            response += gap
            loss += [0] * len(gap)
            logprobs += [0.0] * len(gap)
            valid += [0] * len(gap)
        sampled_start = len(response)
        values, ok = logprobs_of(call)
        response += call.output_ids
        loss += [1] * len(call.output_ids)
        logprobs += values
        valid += ok
        turns.append(TurnSpan(call.key, start, sampled_start, len(response)))
        previous = call
    last = calls[members[-1]]
    chain_class = plan.classes[chain][0]
    policy = config.classes.policy(chain_class)
    return Trace(
        session_id=plan.session_id,
        chain=chain,
        segment=segment,
        chain_class=chain_class,
        trainable=policy.trainable,
        break_reason=reason,
        prompt_ids=first.prompt_ids,
        response_ids=tuple(response),
        loss_mask=tuple(loss),
        response_logprobs=tuple(logprobs),
        logprob_mask=tuple(valid),
        turns=tuple(turns),
        finish_reason=last.finish_reason,
        policy_version=last.policy_version,
        reward_scale=policy.reward_scale,
        truncated_turns=sum(calls[i].finish_reason in _CUT for i in members),
        malformed_tool_calls=sum(len(calls[i].malformed_tool_calls) for i in members),
        # One per trace: segments break where it changes (chains.segments).
        sampling=distribution_of(last.behaviour),
    )


def _trajectory(
    plan: SessionPlan, builder: str, traces: Sequence[Trace], group_id: str | None
) -> Trajectory:
    placed: dict[str, tuple[int, Trace, TurnSpan]] = {}
    for k, trace in enumerate(traces):
        for span in trace.turns:
            placed[span.record] = (k, trace, span)
    fates: list[RecordFate] = []
    for record in plan.records:
        generated = len(record.output_ids)
        if record.key in plan.fates:
            fates.append(RecordFate(record.key, generated, plan.fates[record.key], None))
            continue
        k, trace, span = placed[record.key]
        missing = (
            span.end - span.sampled_start - sum(trace.logprob_mask[span.sampled_start : span.end])
        )
        fate = Fate.DELIVERED if trace.trainable else Fate.CLASS_NOT_TRAINED
        fates.append(RecordFate(record.key, generated, fate, k, missing))
    quarantined: Counter[Fate] = Counter()
    for f in fates:
        if f.fate is not Fate.DELIVERED:
            quarantined[f.fate] += f.generated
    accounting = Accounting(
        captured=sum(f.generated for f in fates),
        delivered=sum(f.generated for f in fates if f.fate is Fate.DELIVERED),
        quarantined=MappingProxyType(dict(quarantined)),
        missing_logprobs=sum(f.missing_logprobs for f in fates if f.fate is Fate.DELIVERED),
        breaks=MappingProxyType(dict(Counter(t.break_reason for t in traces if t.break_reason))),
        truncated_turns=sum(c.finish_reason in _CUT for c in plan.calls),
        records=tuple(fates),
        delivery_flags=MappingProxyType(
            dict(Counter(f.issue for r in plan.records for f in r.delivery_flags))
        ),
        malformed_tool_calls=sum(len(r.malformed_tool_calls) for r in plan.records),
        unreproducible=MappingProxyType(dict(_unreproducible(traces))),
    )
    chains = tuple(
        Chain(
            index=k,
            chain_class=plan.classes[k][0],
            records=tuple(plan.calls[i].key for i in chain),
            forked_from=_parent_key(plan, chain[0]),
            classified_by=plan.classes[k][1],
        )
        for k, chain in enumerate(plan.chains)
    )
    return Trajectory(
        session_id=plan.session_id,
        builder=builder,
        traces=tuple(traces),
        chains=chains,
        accounting=accounting,
        drift=tuple(_drift(plan, i) for i in range(len(plan.calls))),
        group_id=group_id,
    )


def _unreproducible(traces: Sequence[Trace]) -> Counter[Unreproducible]:
    counts: Counter[Unreproducible] = Counter()
    for trace in traces:
        if trace.trainable and isinstance(trace.sampling, Unreproducible):
            counts[trace.sampling] += sum(trace.loss_mask)
    return counts


def _parent_key(plan: SessionPlan, i: int) -> str | None:
    parent = plan.links[i].parent
    return plan.calls[parent].key if parent is not None else None


def _drift(plan: SessionPlan, i: int) -> TurnDrift:
    call, link = plan.calls[i], plan.links[i]
    lineage = call.lineage
    base = None
    if lineage is not None and lineage.base_seq is not None:
        base = f"{call.session_id}/{lineage.base_seq}.{lineage.base_attempt or 1}"
    return TurnDrift(
        record=call.key,
        capture=call.capture,
        relation=link.relation,
        parent=_parent_key(plan, i),
        shared_tokens=link.shared,
        base_tokens=link.base,
        lineage=lineage.origin if lineage is not None else None,
        lineage_base=base,
        lineage_shared_tokens=lineage.shared_tokens if lineage is not None else None,
    )


# ---------------------------------------------------------------- the builders


class PerRequest:
    """One trace per call."""

    name = "per_request"

    def __init__(self, config: BuildConfig) -> None:
        self.config = config

    def build(
        self, records: Iterable[CompletionRecord], *, group_id: str | None = None
    ) -> Trajectory:
        plan = plan_session(records, self.config)
        traces = [
            _trace(plan, self.config, k, position, None, [i])
            for k, chain in enumerate(plan.chains)
            for position, i in enumerate(chain)
        ]
        return _trajectory(plan, self.name, traces, group_id)


class PrefixMerge:
    """One trace per clean segment of each chain."""

    name = "prefix_merge"

    def __init__(self, config: BuildConfig) -> None:
        self.config = config

    def build(
        self, records: Iterable[CompletionRecord], *, group_id: str | None = None
    ) -> Trajectory:
        plan = plan_session(records, self.config)
        traces = [
            _trace(plan, self.config, k, position, reason, members)
            for k, chain in enumerate(plan.chains)
            for position, (reason, members) in enumerate(segments(chain, plan.links, plan.calls))
        ]
        return _trajectory(plan, self.name, traces, group_id)


BUILDERS: Mapping[str, BuilderFactory] = MappingProxyType(
    {PerRequest.name: PerRequest, PrefixMerge.name: PrefixMerge}
)


def resolve_builder(name: str) -> BuilderFactory:
    """A builder by name (``per_request``, ``prefix_merge``) or ``module:attribute``."""
    return load_factory(name, kind="builder", known=BUILDERS, error=UnknownBuilder)
