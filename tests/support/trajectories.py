"""Invariants every trajectory must satisfy, whatever the builder and the session."""

from __future__ import annotations

import math
from collections.abc import Sequence

from polar.ir import CompletionRecord, RecordStatus
from polar.trajectory import Fate, Trajectory


def check_trajectory(records: Sequence[CompletionRecord], trajectory: Trajectory) -> None:
    """Fidelity, masks, exactly-once accounting and (merged) reconstruction.

    * every sampled token and its logprob is in a trace unchanged, under loss
      mask 1, and every other response token has mask 0 and no logprob;
    * every record is accounted for once; its generated tokens are delivered
      (in a trainable trace) or quarantined with a reason, never both;
    * each trace's ``prompt_ids + response_ids`` is its last call's prompt plus
      what that call sampled.
    """
    by_key = {r.key: r for r in records}
    accounting = trajectory.accounting
    assert [f.record for f in accounting.records] == [
        r.key for r in sorted(records, key=lambda r: (r.seq, r.attempt))
    ]
    assert accounting.captured == sum(len(r.output_ids) for r in records)
    assert accounting.captured == accounting.delivered + sum(accounting.quarantined.values())

    placed: dict[str, int] = {}
    delivered = 0
    for index, trace in enumerate(trajectory.traces):
        n = len(trace.response_ids)
        assert len(trace.loss_mask) == len(trace.response_logprobs) == len(trace.logprob_mask) == n
        expected_mask = [0] * n
        position = 0
        for span in trace.turns:
            assert span.record not in placed, f"{span.record} delivered twice"
            placed[span.record] = index
            record = by_key[span.record]
            assert span.start == position <= span.sampled_start <= span.end
            if position == 0:
                assert span.sampled_start == 0, "a trace starts with sampled tokens"
            sampled = slice(span.sampled_start, span.end)
            assert trace.response_ids[sampled] == record.output_ids
            for j in range(len(record.output_ids)):
                expected_mask[span.sampled_start + j] = 1
                real = j < len(record.output_logprobs) and math.isfinite(record.output_logprobs[j])
                k = span.sampled_start + j
                assert trace.logprob_mask[k] == int(real)
                assert trace.response_logprobs[k] == (record.output_logprobs[j] if real else 0.0)
            position = span.end
        assert position == n
        assert list(trace.loss_mask) == expected_mask, "mask 1 exactly on sampled tokens"
        for k in range(n):
            if not trace.loss_mask[k]:
                assert trace.logprob_mask[k] == 0 and trace.response_logprobs[k] == 0.0
        last = by_key[trace.turns[-1].record]
        assert trace.prompt_ids + trace.response_ids == last.prompt_ids + last.output_ids
        assert trace.prompt_ids == by_key[trace.turns[0].record].prompt_ids
        assert len({by_key[t.record].policy_version for t in trace.turns}) == 1
        if trace.trainable:
            delivered += sum(trace.loss_mask)
    assert delivered == accounting.delivered

    for fate in accounting.records:
        record = by_key[fate.record]
        assert fate.generated == len(record.output_ids)
        if fate.record in placed:
            trace = trajectory.traces[placed[fate.record]]
            assert fate.trace == placed[fate.record]
            assert fate.fate is (Fate.DELIVERED if trace.trainable else Fate.CLASS_NOT_TRAINED)
        else:
            assert fate.trace is None
            assert fate.fate not in (Fate.DELIVERED, Fate.CLASS_NOT_TRAINED)
            if record.status is RecordStatus.FAILED:
                assert fate.fate is Fate.FAILED_CALL
            elif record.status is RecordStatus.ABORTED:
                assert fate.fate is Fate.ABORTED_CALL
    completed = [r for r in records if r.status is RecordStatus.COMPLETED and r.prompt_ids]
    last_attempts = {r.seq: r.attempt for r in completed}
    for record in completed:
        if last_attempts[record.seq] == record.attempt:
            assert record.key in placed, f"{record.key} was not delivered"
    chained = [k for chain in trajectory.chains for k in chain.records]
    assert sorted(chained) == sorted(placed)
