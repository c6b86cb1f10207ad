"""What every bridge does with Polar's rollout service: find the task a prompt
names, submit groups, wait for them, and hand each session's trainer samples
over exactly as the node exported them.

A trainer prompt names a task (:class:`TaskIndex`): by the task's id or by its
exact instruction, as a string or as chat messages whose last user message is
that string. One :class:`GroupRequest` is one submitted task, i.e. one GRPO
group of ``num_samples`` sessions. :meth:`PolarRollouts.run` submits every
group first (they run side by side on the nodes), then waits for each; if a
submission is refused or a group does not finish within ``wait_timeout_s``,
the groups already submitted are cancelled and :class:`BridgeError` says why.

A session's samples are the rows of :mod:`polar.trajectory.export`, one per
trainable trace, parsed back with their checks (columns of equal length).
Trainers that take several sequences per rollout (slime) get all of them
(:func:`traces_of`); the others get one (:func:`session_sample`, by
:class:`~polar.bridges.config.TraceChoice`) and the tokens left out are
counted, never silently dropped.

The trainers behind the bridges recompute logprobs at one temperature over
the whole vocabulary, so a trace is trained only when its tokens were drawn
that way: a distribution without top-p, top-k or min-p (the bridge's
``sampling`` policy, enforced by the node gateways, makes it so; its
temperature must be the trainer's own). Any other trace keeps its tokens with
the loss mask off, counted in ``unreproducible_tokens``.

Every bridge treats failed sessions by the one policy of
:mod:`polar.rollout.failure` (:attr:`SessionSample.use`, :attr:`SessionSample.reward`):
the agent's failures (timeout, its harness's exit, a sandbox limit) are trained
with reward 0.0 on their partial trajectory; sessions the infrastructure failed,
and cancelled ones, are masked (no token trained). A trainer that normalises
rewards over a group itself and wants a float for every sample (verl, slime,
NeMo RL) still counts a masked session's placeholder reward in that group:
set ``max_resamples`` so the rollout server replaces such sessions.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, assert_never

from polar.bridges.config import BridgeConfig, TraceChoice
from polar.configfile import ConfigError
from polar.ir import Distribution
from polar.rollout.client import RolloutClient, RolloutError
from polar.rollout.failure import FAILED_REWARD, SessionUse, session_use
from polar.rollout.protocol import SessionResult, SessionStatus, TaskResult, TaskSubmission
from polar.tasks import Task, TaskLoadError, load_tasks
from polar.trajectory import ChainClass, ExportError, Sample, sample_from_row


class BridgeError(Exception):
    """A bridge could not give the trainer what it asked for; one line, in the trainer's terms."""


# ---------------------------------------------------------------- tasks


def prompt_text(prompt: Any) -> str:
    """The text a trainer prompt carries: a string, or the last user message of chat messages."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence) and prompt and all(isinstance(m, Mapping) for m in prompt):
        for message in reversed(prompt):
            if message.get("role") == "user":
                content = message.get("content")
                if isinstance(content, str):
                    return content
                if isinstance(content, Sequence):
                    texts = [
                        part["text"]
                        for part in content
                        if isinstance(part, Mapping) and isinstance(part.get("text"), str)
                    ]
                    if texts:
                        return "".join(texts)
                break
    raise BridgeError(
        f"a prompt must be a task id or instruction, as a string or chat messages "
        f"ending in a user message; got {_preview(prompt)}"
    )


class TaskIndex:
    """The tasks of a task source, found by id or by exact instruction."""

    def __init__(self, tasks: Sequence[Task]) -> None:
        self._by_id = {t.id: t for t in tasks}
        self._by_instruction: dict[str, Task | None] = {}
        for t in tasks:
            key = t.instruction.strip()
            # Two tasks with the same instruction cannot be told apart by it.
            self._by_instruction[key] = None if key in self._by_instruction else t

    @classmethod
    def load(cls, source: str) -> TaskIndex:
        try:
            return cls(load_tasks(source))
        except TaskLoadError as exc:
            raise ConfigError(f"tasks: {exc}") from None

    def __len__(self) -> int:
        return len(self._by_id)

    def find(self, prompt: Any) -> Task:
        text = prompt_text(prompt)
        task = self._by_id.get(text.strip())
        if task is not None:
            return task
        key = text.strip()
        if key in self._by_instruction:
            found = self._by_instruction[key]
            if found is None:
                raise BridgeError(f"several tasks have the instruction {_preview(text)}; use an id")
            return found
        raise BridgeError(f"no task has the id or instruction {_preview(text)}")


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# ---------------------------------------------------------------- groups


@dataclass(frozen=True, slots=True)
class GroupRequest:
    """One group to run: ``num_samples`` sessions of ``task``."""

    task: Task
    num_samples: int
    group_id: str | None = None
    policy_version: int | None = None
    metadata: Mapping[str, Any] | None = None


class PolarRollouts:
    """Submits groups to the rollout server and waits for their results."""

    def __init__(self, config: BridgeConfig, *, client: RolloutClient | None = None) -> None:
        self.config = config
        self._client = client or RolloutClient(
            config.rollout_url, token=config.token(), timeout_s=config.request_timeout_s
        )
        self._tasks: TaskIndex | None = None

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> PolarRollouts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def tasks(self) -> TaskIndex:
        """The configured task source, loaded on first use."""
        if self._tasks is None:
            self._tasks = TaskIndex.load(self.config.tasks)
        return self._tasks

    def task_for(self, prompt: Any) -> Task:
        return self.tasks.find(prompt)

    def submission(self, group: GroupRequest) -> TaskSubmission:
        c = self.config
        return TaskSubmission(
            task=group.task,
            harness=c.harness,
            num_samples=group.num_samples,
            builder=c.builder,
            session_timeout_s=c.session_timeout_s,
            max_resamples=c.max_resamples,
            group_id=group.group_id,
            policy_version=group.policy_version,
            sampling=c.sampling,
            metadata={**c.metadata, **(group.metadata or {})},
        )

    def run(self, groups: Sequence[GroupRequest]) -> list[TaskResult]:
        """Every group's result, in order; all or nothing (see the module docstring)."""
        task_ids: list[str] = []
        try:
            for group in groups:
                task_ids.append(self._client.submit(self.submission(group)).task_id)
            deadline = time.monotonic() + self.config.wait_timeout_s
            results = []
            for task_id in task_ids:
                left = max(0.0, deadline - time.monotonic())
                results.append(self._client.wait(task_id, timeout_s=left))
        except RolloutError as exc:
            self._cancel(task_ids)
            raise BridgeError(f"rollout server {self.config.rollout_url}: {exc}") from None
        except TimeoutError:
            self._cancel(task_ids)
            raise BridgeError(
                f"{len(task_ids)} group(s) did not finish within wait_timeout_s "
                f"({self.config.wait_timeout_s:g} s); cancelled"
            ) from None
        except BaseException:
            self._cancel(task_ids)
            raise
        for group, result in zip(groups, results, strict=True):
            found = len(current_sessions(result))
            if found != group.num_samples:
                raise BridgeError(
                    f"task {result.task_id} ({result.status.value}) has {found} sessions, "
                    f"{group.num_samples} were asked for"
                )
        return results

    def _cancel(self, task_ids: Sequence[str]) -> None:
        for task_id in task_ids:
            with contextlib.suppress(RolloutError):
                self._client.cancel(task_id)


def current_sessions(result: TaskResult) -> list[SessionResult]:
    """The group's sessions by sample index, without those replaced by a resample."""
    return result.current


# ---------------------------------------------------------------- samples


def traces_of(result: SessionResult) -> list[Sample]:
    """A session's trainer samples (one per trainable trace), checked, in chain order;
    a trace a bridge's trainer cannot reproduce has its loss mask off
    (:func:`reproducible`)."""
    samples = [
        s if reproducible(s) else replace(s, loss_mask=(0,) * len(s.loss_mask))
        for s in _parsed(result)
    ]
    return sorted(samples, key=lambda s: (s.chain, s.segment))


def reproducible(sample: Sample) -> bool:
    """Whether a one-temperature, whole-vocabulary trainer recomputes the distribution
    the sample's tokens were drawn from (see the module docstring)."""
    return isinstance(sample.sampling, Distribution) and not sample.sampling.truncated


def unreproducible_tokens(result: SessionResult) -> int:
    """Sampled tokens of the session :func:`traces_of` masks off."""
    return sum(sum(s.loss_mask) for s in _parsed(result) if not reproducible(s))


def _parsed(result: SessionResult) -> list[Sample]:
    try:
        return [
            sample_from_row(row, f"session {result.session_id} sample {i}")
            for i, row in enumerate(result.samples)
        ]
    except ExportError as exc:
        raise BridgeError(str(exc)) from None


@dataclass(frozen=True, slots=True)
class SessionSample:
    """What a one-sequence-per-rollout trainer receives for one session."""

    session: SessionResult
    group_id: str
    trace: Sample | None
    """None: the session left no trainable trace (it failed early, or never called the model)."""
    traces: int
    """Trainable traces the session produced."""
    undelivered_tokens: int
    """Sampled tokens (loss mask 1) in the traces that were not delivered."""
    unreproducible_tokens: int = 0
    """Sampled tokens masked off because the trainer cannot recompute their
    distribution (:func:`reproducible`)."""

    @property
    def use(self) -> SessionUse:
        """What trainers do with the session (:func:`polar.rollout.failure.session_use`)."""
        return session_use(self.session)

    @property
    def reward(self) -> float | None:
        """The reward to train the delivered trace with (:func:`trace_reward`)."""
        return trace_reward(self.session, self.trace)

    @property
    def failure(self) -> str | None:
        """Why the session failed, as its wire name (None: it did not)."""
        failure = self.session.failure
        return failure.value if failure is not None else None

    @property
    def usable(self) -> bool:
        """Trained: not masked, with tokens to train on."""
        return self.use is not SessionUse.MASKED and self.trace is not None

    @property
    def truncated(self) -> bool:
        return self.session.status is SessionStatus.TIMEOUT or (
            self.trace is not None and self.trace.truncated_turns > 0
        )


def trace_reward(session: SessionResult, trace: Sample | None) -> float | None:
    """The reward a trace of ``session`` trains with, by :mod:`polar.rollout.failure`:
    when scored, the trace's own (outcome x its class's scale; the session's when
    there is no trace); 0.0 for the agent's failure; None when masked."""
    match session_use(session):
        case SessionUse.SCORED:
            if trace is not None and trace.reward is not None:
                return trace.reward
            return session.reward
        case SessionUse.FAILED:
            return FAILED_REWARD
        case SessionUse.MASKED:
            return None
        case unreachable:
            assert_never(unreachable)


def trained_tokens(sample: Sample) -> int:
    return sum(sample.loss_mask)


def logprob_loss_mask(sample: Sample) -> list[int]:
    """The loss mask without the sampled tokens that have no recorded logprob
    (``logprob_mask`` 0: the engine reported none, or a non-finite one).

    For trainers that read a rollout logprob under every mask-1 token (verl's
    and slime's importance correction, NeMo RL's) and have no way to say
    "missing": a 0.0 there would claim probability 1 for the sampled token.
    Such a token is not trained by them (:func:`missing_logprobs` counts it);
    TRL, which takes ``None`` as "no logprob", keeps it.
    """
    return [m & p for m, p in zip(sample.loss_mask, sample.logprob_mask, strict=True)]


def missing_logprobs(sample: Sample) -> int:
    """Sampled tokens (loss mask 1) without a recorded logprob."""
    return sum(m & (1 - p) for m, p in zip(sample.loss_mask, sample.logprob_mask, strict=True))


def session_sample(result: SessionResult, group_id: str, choice: TraceChoice) -> SessionSample:
    traces = traces_of(result)
    if not traces:
        return SessionSample(result, group_id, None, 0, 0)
    match choice:
        case TraceChoice.STRICT:
            if len(traces) > 1:
                raise BridgeError(
                    f"session {result.session_id} has {len(traces)} trainable traces "
                    f"({', '.join(t.trace_id for t in traces)}) and trace is 'strict'"
                )
            chosen = traces[0]
        case TraceChoice.MAIN:
            chosen = max(
                traces, key=lambda t: (t.chain_class is ChainClass.MAIN, trained_tokens(t))
            )
    left_out = sum(trained_tokens(t) for t in traces if t is not chosen)
    return SessionSample(
        result, group_id, chosen, len(traces), left_out, unreproducible_tokens(result)
    )


def group_sessions(result: TaskResult, choice: TraceChoice) -> list[SessionSample]:
    return [session_sample(r, result.group_id, choice) for r in current_sessions(result)]
