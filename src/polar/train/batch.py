"""From finished groups to what a training step consumes: groups of scored
sessions, one row per trace with its advantage and loss weight, and
microbatches of tensors.

Nothing is re-tokenised: a row is a sample's ``prompt_ids + response_ids``,
exactly the tokens the engine saw and sampled (the rollout's samples, built by
``prefix_merge`` or ``per_request`` on the node). Only the loss-masked
response tokens are trained, each with the logprob the engine recorded and
the distribution it was drawn from (the sample's ``sampling``). A sample whose
distribution cannot be reproduced (:class:`polar.ir.Unreproducible`: greedy,
penalties, logprobs of another distribution...) is not trained; its tokens
are counted by why (:func:`unreproducible_tokens`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from polar.distribution import Settings
from polar.ir import Distribution, Unreproducible
from polar.ir.behaviour import MODEL
from polar.rollout.failure import SessionUse, outcome_reward, session_use
from polar.rollout.protocol import TaskResult
from polar.train.grpo import (
    Aggregation,
    Baseline,
    MissingLogprob,
    TraceShape,
    group_advantages,
    trace_weights,
)
from polar.trajectory.errors import ExportError
from polar.trajectory.export import Sample, sample_from_row


@dataclass(frozen=True, slots=True)
class ScoredSession:
    session_id: str
    reward: float
    """Its outcome reward under :mod:`polar.rollout.failure`: the score, or 0.0 for
    the agent's failure."""
    samples: tuple[Sample, ...]


@dataclass(frozen=True, slots=True)
class Group:
    """One task's sessions that train (:mod:`polar.rollout.failure`): those completed
    and scored, and those the agent failed (reward 0.0, their partial trajectories)."""

    task_id: str
    task: str
    group_id: str
    sessions: tuple[ScoredSession, ...]
    masked: int = 0
    """Sessions not trained: the infrastructure failed them or they were cancelled
    (replaced sessions not counted)."""
    agent_failed: int = 0
    """Sessions in ``sessions`` that the agent failed (timeout, its harness's exit,
    a sandbox limit)."""
    invalid_samples: int = 0
    """Sessions dropped because a sample row did not parse (a bug upstream)."""
    submitted_version: int | None = None

    @property
    def rewards(self) -> list[float]:
        return [s.reward for s in self.sessions]

    @property
    def oldest_version(self) -> int | None:
        """The oldest policy version that sampled any of its tokens (None: no samples)."""
        versions = [x.policy_version for s in self.sessions for x in s.samples]
        return min(versions) if versions else None

    def staleness(self, current_version: int) -> int:
        """How many versions behind ``current_version`` its oldest token is."""
        oldest = self.oldest_version
        if oldest is None:
            oldest = self.submitted_version if self.submitted_version is not None else 0
        return max(0, current_version - oldest)


def group_from_result(result: TaskResult) -> Group:
    """The group of a task result under the failed-session policy
    (:func:`polar.rollout.failure.session_use`): scored sessions with their reward,
    the agent's failures with 0.0, masked ones counted and left out; a session
    replaced by a resample is not part of the group. Samples parsed and checked."""
    sessions = []
    invalid = masked = failed = 0
    for r in result.current:
        reward = outcome_reward(r)
        if reward is None:
            masked += 1
            continue
        try:
            samples = tuple(
                sample_from_row(row, f"{r.session_id} sample {i}")
                for i, row in enumerate(r.samples)
            )
        except ExportError:
            invalid += 1
            continue
        failed += session_use(r) is SessionUse.FAILED
        sessions.append(ScoredSession(r.session_id, reward, samples))
    return Group(
        task_id=result.task_id,
        task=result.task,
        group_id=result.group_id,
        sessions=tuple(sessions),
        masked=masked,
        agent_failed=failed,
        invalid_samples=invalid,
        submitted_version=result.policy_version,
    )


# ---------------------------------------------------------------- rows


@dataclass(frozen=True, slots=True)
class Row:
    """One trace as the loss sees it."""

    session: str
    ids: tuple[int, ...]
    """``prompt_ids + response_ids``."""
    start: int
    """Where the response begins in ``ids``."""
    loss_mask: tuple[int, ...]
    """Over the response: 1 where the token is trained (after ``MissingLogprob``)."""
    rollout_logprobs: tuple[float, ...]
    logprob_mask: tuple[int, ...]
    advantage: float
    weight: float
    """Factor on the sum of this row's token losses (the aggregation's normalisation)."""
    policy_version: int
    sampling: Distribution = MODEL
    """The distribution its sampled tokens were drawn from (and recomputed under)."""

    @property
    def loss_tokens(self) -> int:
        return sum(self.loss_mask)


@dataclass(frozen=True, slots=True)
class Advantages:
    """Per session advantage, and what the step logs about the groups."""

    by_session: dict[str, float]
    zero_advantage_groups: int
    groups: int


def advantages_of(groups: Sequence[Group], *, baseline: Baseline, scale_by_std: bool) -> Advantages:
    by_session: dict[str, float] = {}
    zero = 0
    for group in groups:
        values = group_advantages(group.rewards, baseline=baseline, scale_by_std=scale_by_std)
        if all(v == 0 for v in values):
            zero += 1
        for session, value in zip(group.sessions, values, strict=True):
            by_session[session.session_id] = value
    return Advantages(by_session, zero, len(groups))


def rows_of(
    groups: Sequence[Group],
    advantages: Advantages,
    *,
    aggregation: Aggregation,
    missing_logprob: MissingLogprob,
) -> list[Row]:
    """Every trace of every session as a row; each trace's advantage is its
    session's times the trace's class ``reward_scale``; weights normalise over
    all the rows given (one optimizer step's worth). Traces whose sampling
    distribution cannot be reproduced are left out (:func:`unreproducible_tokens`)."""
    pending: list[_Pending] = []
    for group in groups:
        for session in group.sessions:
            advantage = advantages.by_session[session.session_id]
            for sample in session.samples:
                if isinstance(sample.sampling, Unreproducible):
                    continue
                mask = sample.loss_mask
                if missing_logprob is MissingLogprob.DROP:
                    mask = tuple(m & p for m, p in zip(mask, sample.logprob_mask, strict=True))
                pending.append(
                    _Pending(
                        session.session_id,
                        sample,
                        advantage * sample.reward_scale,
                        mask,
                        sample.sampling,
                    )
                )
    return _weighted(pending, aggregation)


@dataclass(frozen=True, slots=True)
class _Pending:
    session: str
    sample: Sample
    advantage: float
    mask: tuple[int, ...]
    sampling: Distribution


def unreproducible_tokens(groups: Sequence[Group]) -> Counter[Unreproducible]:
    """Loss tokens :func:`rows_of` leaves out, by why their distribution is unknown."""
    counts: Counter[Unreproducible] = Counter()
    for group in groups:
        for session in group.sessions:
            for sample in session.samples:
                if isinstance(sample.sampling, Unreproducible):
                    counts[sample.sampling] += sum(sample.loss_mask)
    return counts


def reweighted(rows: Sequence[Row], aggregation: Aggregation) -> list[Row]:
    """The same rows normalised among themselves (a minibatch of a step)."""
    shapes = [TraceShape(r.session, r.loss_tokens) for r in rows]
    weights = trace_weights(shapes, aggregation)
    return [replace(r, weight=w) for r, w in zip(rows, weights, strict=True)]


def _weighted(pending: list[_Pending], aggregation: Aggregation) -> list[Row]:
    shapes = [TraceShape(p.session, sum(p.mask)) for p in pending]
    weights = trace_weights(shapes, aggregation)
    return [
        Row(
            session=p.session,
            ids=p.sample.prompt_ids + p.sample.response_ids,
            start=len(p.sample.prompt_ids),
            loss_mask=p.mask,
            rollout_logprobs=p.sample.rollout_logprobs,
            logprob_mask=p.sample.logprob_mask,
            advantage=p.advantage,
            weight=weight,
            policy_version=p.sample.policy_version,
            sampling=p.sampling,
        )
        for p, weight in zip(pending, weights, strict=True)
        if sum(p.mask) > 0
    ]


def split_by_session(rows: Sequence[Row], parts: int) -> list[list[Row]]:
    """``parts`` minibatches, a session's rows kept together, sessions dealt in turn."""
    order: dict[str, int] = {}
    for row in rows:
        order.setdefault(row.session, len(order))
    out: list[list[Row]] = [[] for _ in range(min(parts, max(1, len(order))))]
    for row in rows:
        out[order[row.session] % len(out)].append(row)
    return [part for part in out if part]


# ---------------------------------------------------------------- tensors


@dataclass(frozen=True, slots=True)
class MicroBatch:
    """Rows in one forward pass; loss tokens flattened.

    ``input_ids``/``position_ids``: [B, T]. Padded: one row per trace,
    right-padded, with its ``attention_mask`` [B, T]. Packed (:func:`microbatches`
    with ``packed``): several traces end to end in each row, ``position_ids``
    starting again at 0 at each trace and no ``attention_mask``, from which
    ``transformers`` attends within each trace only. Every other tensor is [N]
    over the loss tokens: ``rows``/``cols`` index the hidden state that predicts
    each one (position ``t - 1`` of its trace for token ``t``), ``targets`` the
    token ids.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    position_ids: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    targets: torch.Tensor
    rollout_logprobs: torch.Tensor
    rollout_mask: torch.Tensor
    advantages: torch.Tensor
    weights: torch.Tensor
    versions: torch.Tensor
    sampling: Settings
    """Each loss token's sampling distribution (:mod:`polar.distribution`)."""
    truncates: bool
    """Whether any of them removes tokens (top-p, top-k, min-p), known here on
    the host so that the step need not ask the device."""
    tempered: bool
    """Whether any of them has a temperature other than 1 (else the logits are
    used unscaled), known here on the host for the same reason."""
    tokens: int
    """Real (unpadded) tokens in the forward pass."""

    def to(self, device: torch.device) -> MicroBatch:
        """Every tensor on ``device``, the sampling settings' included. To a GPU
        from page-locked memory without waiting: the host goes on queueing work
        (the copies are ordered before the kernels that read them)."""
        staged = device.type == "cuda" and self.input_ids.device.type == "cpu"
        moved: dict[str, object] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if isinstance(value, torch.Tensor | Settings):
                if staged:
                    value = value.pin_memory()  # a tensor or the sampling settings
                moved[name] = value.to(device, non_blocking=staged)
        return replace(self, **moved)  # type: ignore[arg-type]


def microbatches(
    rows: Sequence[Row], *, max_tokens: int, pad_id: int, packed: bool = False
) -> list[MicroBatch]:
    """Rows in microbatches of at most ``max_tokens`` tokens, longest first (a row
    longer than that gets one to itself). Padded: ``rows x longest <= max_tokens``
    per microbatch; packed: the traces' own lengths add up to at most
    ``max_tokens`` in each of them (first fit), with no padding at all."""
    ordered = sorted(rows, key=lambda r: len(r.ids), reverse=True)
    if packed:
        bins: list[list[Row]] = []
        room: list[int] = []
        for row in ordered:
            for i, left in enumerate(room):
                if len(row.ids) <= left:
                    bins[i].append(row)
                    room[i] -= len(row.ids)
                    break
            else:
                bins.append([row])
                room.append(max_tokens - len(row.ids))
        return [_collate([pack], pad_id) for pack in bins]
    packs: list[list[Row]] = []
    for row in ordered:
        if packs and (len(packs[-1]) + 1) * len(packs[-1][0].ids) <= max_tokens:
            packs[-1].append(row)
        else:
            packs.append([row])
    return [_collate([[row] for row in pack], pad_id) for pack in packs]


def _collate(lines: list[list[Row]], pad_id: int) -> MicroBatch:
    """One forward pass: each line is a row of the batch holding its traces end
    to end (one each when padded); right-padded to the longest line."""
    width = max(sum(len(r.ids) for r in line) for line in lines)
    ids = torch.full((len(lines), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(lines), width), dtype=torch.long)
    positions = torch.zeros((len(lines), width), dtype=torch.long)
    # Per trace, then concatenated: the loss tokens' tensors in trace order.
    rows, cols, targets, rollout, rmask, adv, weight, version = [], [], [], [], [], [], [], []
    sampling: list[Distribution] = []
    counts: list[int] = []
    for b, line in enumerate(lines):
        offset = 0
        for row in line:
            n = len(row.ids)
            trace = torch.tensor(row.ids, dtype=torch.long)
            ids[b, offset : offset + n] = trace
            attention[b, offset : offset + n] = 1
            positions[b, offset : offset + n] = torch.arange(n)
            kept = torch.tensor(row.loss_mask, dtype=torch.bool).nonzero().squeeze(1)  # [k]
            at = row.start + kept  # the trained tokens' positions in the trace
            if at.numel() and int(at[0]) == 0:
                raise ValueError("a trained token at position 0 has no context to predict it from")
            k = int(kept.numel())
            rows.append(torch.full((k,), b, dtype=torch.long))
            cols.append(offset + at - 1)
            targets.append(trace[at])
            rollout.append(torch.tensor(row.rollout_logprobs, dtype=torch.float64)[kept])
            rmask.append(torch.tensor(row.logprob_mask, dtype=torch.bool)[kept])
            adv.append(torch.full((k,), row.advantage, dtype=torch.float32))
            weight.append(torch.full((k,), row.weight, dtype=torch.float64))
            version.append(torch.full((k,), row.policy_version, dtype=torch.long))
            sampling.append(row.sampling)
            counts.append(k)
            offset += n
    packed = any(len(line) > 1 for line in lines)
    if not packed:  # padding positions go on counting (they are masked out)
        positions = torch.arange(width).expand(len(lines), width).clone()
    trained = [d for d, k in zip(sampling, counts, strict=True) if k]
    repeats = torch.tensor(counts, dtype=torch.long)
    return MicroBatch(
        input_ids=ids,
        attention_mask=None if packed else attention,
        position_ids=positions,
        rows=torch.cat(rows),
        cols=torch.cat(cols),
        targets=torch.cat(targets),
        rollout_logprobs=torch.cat(rollout),
        rollout_mask=torch.cat(rmask),
        advantages=torch.cat(adv),
        weights=torch.cat(weight),
        versions=torch.cat(version),
        sampling=Settings.of(sampling).repeated(repeats),
        truncates=any(d.truncated for d in trained),
        tempered=any(d.temperature != 1.0 for d in trained),
        tokens=sum(len(r.ids) for line in lines for r in line),
    )
