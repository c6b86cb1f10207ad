"""Sessions' trajectories, built again from their records, and the token view's data.

A session's trajectory is what a node builds when the session ends (the same
builder, the same chat-template facts), so the token view shows exactly what a
trainer got: every token of a trace (its prompt, then the response) with its
text, its loss mask and its rollout logprob, and markers where the trace's
records begin, where it broke off its chain's previous trace (the break
reason) and where its prompt drifts from the call it continues.

Built trajectories are kept per session (least recently used first out), keyed
by the session's records as they stand, so a session still running is built
again once it has a new call.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from polar.ir import CompletionRecord
from polar.proxy.render.tokens import TokenText
from polar.tokenizer import Tokenizer
from polar.trajectory import (
    BuildConfig,
    Relation,
    Trace,
    Trajectory,
    TurnDrift,
    TurnFormat,
    resolve_builder,
)

CONTINUING = frozenset({Relation.FRESH, Relation.EXTENDS, Relation.CLOSED})
"""Relations whose prompt is a clean continuation: no drift marker."""


@dataclass(frozen=True, slots=True)
class Built:
    records: tuple[CompletionRecord, ...]
    trajectory: Trajectory

    @property
    def by_key(self) -> dict[str, CompletionRecord]:
        return {record.key: record for record in self.records}


class Trajectories:
    """Builds sessions' trajectories with one builder and keeps the latest few."""

    def __init__(self, builder: str, tokenizer: Tokenizer, *, capacity: int) -> None:
        self.text = TokenText(tokenizer)
        config = BuildConfig(turns=TurnFormat.from_tokenizer(tokenizer), decode=self.text.decode)
        self._builder = resolve_builder(builder)(config)
        self._capacity = capacity
        self._cache: OrderedDict[str, tuple[tuple[Any, ...], Built]] = OrderedDict()

    def of(self, session_id: str, records: Sequence[CompletionRecord]) -> Built:
        """Raises :class:`polar.trajectory.TrajectoryError` when the records do not build."""
        signature = tuple((r.key, r.status, len(r.output_ids)) for r in records)
        cached = self._cache.get(session_id)
        if cached is not None and cached[0] == signature:
            self._cache.move_to_end(session_id)
            return cached[1]
        built = Built(tuple(records), self._builder.build(records))
        self._cache[session_id] = (signature, built)
        while len(self._cache) > self._capacity:
            self._cache.popitem(last=False)
        return built

    def token_text(self, token_id: int) -> str:
        return self.text.bytes_of(token_id).decode("utf-8", "replace")


def drift_of(trajectory: Trajectory) -> dict[str, TurnDrift]:
    return {drift.record: drift for drift in trajectory.drift}


def markers(trace: Trace, drift: dict[str, TurnDrift]) -> list[dict[str, Any]]:
    """Where the trace's records begin, its break, and drift, as token positions
    in ``prompt_ids + response_ids``."""
    prompt = len(trace.prompt_ids)
    out: list[dict[str, Any]] = []
    if trace.break_reason is not None:
        out.append(
            {
                "at": 0,
                "kind": "break",
                "label": f"break: {trace.break_reason.value} (segment {trace.segment})",
            }
        )
    for index, span in enumerate(trace.turns):
        turn = drift.get(span.record)
        if index == 0 and turn is not None and turn.relation not in CONTINUING:
            out.append(
                {
                    "at": min(turn.shared_tokens, prompt),
                    "kind": "drift",
                    "label": f"drift: {turn.relation.value} against {turn.parent}, "
                    f"{turn.shared_tokens} of {turn.base_tokens} tokens shared",
                }
            )
        if turn is not None and turn.agrees_with_lineage is False:
            out.append(
                {
                    "at": prompt + span.start,
                    "kind": "lineage",
                    "label": f"gateway lineage disagrees: it measured "
                    f"{turn.lineage_shared_tokens} shared tokens, the builder {turn.shared_tokens}",
                }
            )
        if span.start < span.sampled_start:
            out.append(
                {"at": prompt + span.start, "kind": "turn", "label": f"{span.record}: new prompt"}
            )
        out.append(
            {"at": prompt + span.sampled_start, "kind": "turn", "label": f"{span.record}: sampled"}
        )
    return sorted(out, key=lambda m: m["at"])


def token_view(trajectories: Trajectories, built: Built, index: int) -> dict[str, Any]:
    """Everything the token view of ``built``'s trace ``index`` shows."""
    trace = built.trajectory.traces[index]
    ids = [*trace.prompt_ids, *trace.response_ids]
    prompt = len(trace.prompt_ids)
    logprobs: list[float | None] = [None] * prompt
    logprobs.extend(
        value if real else None
        for value, real in zip(trace.response_logprobs, trace.logprob_mask, strict=True)
    )
    return {
        "trace": trace.id,
        "index": index,
        "chain": trace.chain,
        "segment": trace.segment,
        "chain_class": trace.chain_class.value,
        "trainable": trace.trainable,
        "break_reason": trace.break_reason.value if trace.break_reason else None,
        "policy_version": trace.policy_version,
        "prompt_tokens": prompt,
        "total": len(ids),
        "trained_tokens": sum(trace.loss_mask),
        "ids": ids,
        "text": [trajectories.token_text(i) for i in ids],
        "mask": [0] * prompt + list(trace.loss_mask),
        "logprob": logprobs,
        "markers": markers(trace, drift_of(built.trajectory)),
    }
