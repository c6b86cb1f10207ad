"""Wire models of the rollout service: what clients submit, what the server
sends nodes, what nodes report back.

One submission is one task run with ``num_samples`` sessions: one GRPO group.
Sessions move through :class:`SessionStatus`; a node reports each finished
session as a :class:`SessionResult` (its trainer samples included; a failed
one names its :class:`~polar.rollout.failure.FailureReason`), and the server
answers the submission with a :class:`TaskResult`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_serializer,
    field_validator,
    model_validator,
)

from polar.ir import DeliveryIssue, Unreproducible
from polar.proxy.call.behaviour import SamplingPolicy
from polar.rollout.failure import FailureReason
from polar.tasks.model import Task
from polar.trajectory.export import SampleRow
from polar.trajectory.trace import Accounting, BreakReason, Fate

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SessionStatus(StrEnum):
    QUEUED = "queued"
    """Waiting for a node (server) or for a preparation slot (node)."""
    DISPATCHED = "dispatched"
    """Sent to a node, which has not reported progress yet (server only)."""
    PREPARING = "preparing"
    """Workspace, runtime and set-up commands being prepared."""
    READY = "ready"
    """Prepared; waiting for an agent slot."""
    RUNNING = "running"
    """The harness is running (the session's timeout runs from here)."""
    BUILDING = "building"
    EVALUATING = "evaluating"
    COMPLETED = "completed"
    """Ran, built and scored."""
    ERROR = "error"
    """Could not be run, built or scored; ``error`` says why, ``failure`` whose fault."""
    TIMEOUT = "timeout"
    """The harness ran past its timeout; the partial trajectory is kept, unscored."""
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset(
    {SessionStatus.COMPLETED, SessionStatus.ERROR, SessionStatus.TIMEOUT, SessionStatus.CANCELLED}
)


class TaskStatus(StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    """Every session ended and at least one completed (some may have failed: see the results)."""
    FAILED = "failed"
    """Every session ended and none completed: nothing of the task is usable."""
    CANCELLED = "cancelled"


class EventKind(StrEnum):
    """What an event of the rollout server's stream (SSE ``event:``) reports."""

    TASK_SUBMITTED = "task.submitted"
    SESSION_STATUS = "session.status"
    """A session changed status (queued again as a resample: ``replaces`` names the failed one)."""
    SESSION_RESULT = "session.result"
    TASK_FINISHED = "task.finished"
    """The last event of a task's own stream."""
    NODE_REGISTERED = "node.registered"
    NODE_LOST = "node.lost"
    OVERFLOW = "overflow"
    """The subscriber read too slowly and was cut off: the stream's last event."""


class HarnessSpec(_Model):
    name: str = Field(min_length=1)
    """A preset (``codex``, ``claude_code``, ``qwen_code``, ``pi``, ``opencode``,
    ``mini_swe_agent``, ``shell``) or ``package.module:factory``."""
    options: dict[str, Any] = Field(default_factory=dict)


class TaskSubmission(_Model):
    task: Task
    harness: HarnessSpec
    task_id: str | None = Field(default=None, pattern=ID_PATTERN, max_length=120)
    """The id the task gets (default: a fresh random one). An id the server
    already holds is refused (409), so a client that lost track of a submission
    looks it up instead of running it twice. Sessions are ``<task_id>-s<i>``."""
    num_samples: int = Field(default=1, ge=1, le=1024)
    builder: str = "prefix_merge"
    session_timeout_s: float = Field(default=1800.0, gt=0)
    """The agent's time budget; it starts when the harness starts, not at submission."""
    early_stop_at: int | None = Field(default=None, ge=1)
    """Cancel the rest once this many sessions completed with a reward."""
    max_resamples: int = Field(default=0, ge=0, le=1024)
    """Extra sessions the server may start to replace those the infrastructure failed
    (:func:`polar.rollout.failure.replaceable`); the agent's failures are results."""
    callback_url: str | None = None
    callback_secret: str | None = Field(default=None, min_length=16, max_length=512, repr=False)
    """The key the task's callback is signed with (default: the control token);
    see :mod:`polar.rollout.callbacks`. Never shown back."""
    group_id: str | None = Field(default=None, pattern=ID_PATTERN)
    policy_version: int | None = None
    all_traces: bool = False
    """Also return the traces whose chain class is not trained (side calls, by
    default), marked ``trainable: false``; the default returns only trainable ones."""
    conversations: bool = False
    """Also return each sample's conversation as OpenAI chat messages (see
    :mod:`polar.rollout.conversation`): what SFT exports need, not a trainer."""
    sampling: SamplingPolicy | None = None
    """Enforced on every model call of the task's sessions, whatever the harness asks
    (:mod:`polar.proxy.call.behaviour`); none: the harness's own settings (what it leaves
    unset filled with the node gateway's defaults)."""
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> TaskSubmission:
        if self.early_stop_at is not None and self.early_stop_at > self.num_samples:
            raise ValueError(
                f"early_stop_at ({self.early_stop_at}) exceeds num_samples ({self.num_samples})"
            )
        if self.callback_url is not None and not self.callback_url.startswith(
            ("http://", "https://")
        ):
            raise ValueError("callback_url must start with http:// or https://")
        return self


class SessionDispatch(_Model):
    """What the server sends a node to run one session."""

    session_id: str = Field(pattern=ID_PATTERN)
    task_id: str = Field(pattern=ID_PATTERN)
    sample_index: int = Field(ge=0)
    task: Task
    harness: HarnessSpec
    builder: str
    session_timeout_s: float = Field(gt=0)
    group_id: str
    all_traces: bool = False
    conversations: bool = False
    sampling: SamplingPolicy | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    result_url: str | None = None
    """Where the node POSTs the :class:`SessionResult` (None: kept for polling)."""


class SessionAccounting(_Model):
    """Where a session's generated tokens went (:class:`polar.trajectory.trace.Accounting`,
    less its per-record fates)."""

    captured: int = Field(ge=0)
    delivered: int = Field(ge=0)
    delivered_fraction: float
    missing_logprobs: int = Field(ge=0)
    quarantined: dict[Fate, int] = Field(default_factory=dict)
    """Tokens kept out of training, by why."""
    breaks: dict[BreakReason, int] = Field(default_factory=dict)
    malformed_tool_calls: int = Field(default=0, ge=0)
    delivery_flags: dict[DeliveryIssue, int] = Field(default_factory=dict)
    unreproducible: dict[Unreproducible, int] = Field(default_factory=dict)
    """Delivered tokens whose sampling distribution a trainer cannot reproduce, by why."""

    @classmethod
    def of(cls, accounting: Accounting) -> SessionAccounting:
        return cls(
            captured=accounting.captured,
            delivered=accounting.delivered,
            delivered_fraction=accounting.delivered_fraction,
            missing_logprobs=accounting.missing_logprobs,
            quarantined=dict(accounting.quarantined),
            breaks=dict(accounting.breaks),
            malformed_tool_calls=accounting.malformed_tool_calls,
            delivery_flags=dict(accounting.delivery_flags),
            unreproducible=dict(accounting.unreproducible),
        )


class SessionResult(_Model):
    session_id: str
    task_id: str
    sample_index: int
    node_id: str | None = None
    """None: ended on the server without reaching a node (cancelled while queued, lost)."""
    status: SessionStatus
    reward: float | None = None
    resolved: bool | None = None
    error: str | None = None
    failure: FailureReason | None = None
    """Why an ended session did not complete, decided where it failed; its fault
    decides what trainers do with it (:mod:`polar.rollout.failure`). None for a
    completed session. A result without one (from an older node or server) gets
    the reason its status meant then (:func:`inferred_failure`)."""
    evaluation: dict[str, Any] = Field(default_factory=dict)
    """The evaluator's details (per-test outcomes, exit codes) and log tail."""
    agent: dict[str, Any] = Field(default_factory=dict)
    """How the harness ended: exit code, timed out, output tails."""
    timings: dict[str, float] = Field(default_factory=dict)
    """Seconds spent per stage: queued, preparing, ready, running, building, evaluating."""
    accounting: SessionAccounting | None = None
    """Where the session's generated tokens went (None: no trajectory was built;
    ``{}`` on the wire)."""
    samples: list[SampleRow] = Field(default_factory=list)
    """Trainer samples, one per trainable trace (``polar.trajectory`` export rows);
    one per trace with ``all_traces``."""
    conversations: list[dict[str, Any]] = Field(default_factory=list)
    """With ``conversations``: one per sample, in the same order
    (:func:`polar.rollout.conversation.conversation_json`)."""
    records: int = 0
    """Completion records the gateway kept for the session."""

    @field_validator("accounting", mode="before")
    @classmethod
    def _no_accounting(cls, value: Any) -> Any:
        return None if value == {} else value

    @model_validator(mode="before")
    @classmethod
    def _older_failure(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("failure") is None and "status" in data:
            try:
                inferred = inferred_failure(SessionStatus(data["status"]))
            except ValueError:
                return data  # the status field's own check names the problem
            if inferred is not None:
                return {**data, "failure": inferred}
        return data

    @model_validator(mode="after")
    def _failure_matches_status(self) -> SessionResult:
        if self.failure is not None and self.status is SessionStatus.COMPLETED:
            raise ValueError(f"a completed session has no failure (got {self.failure.value})")
        return self

    @field_serializer("accounting", mode="wrap")
    def _accounting_or_empty(
        self, value: SessionAccounting | None, handler: SerializerFunctionWrapHandler
    ) -> Any:
        return {} if value is None else handler(value)

    @property
    def usable(self) -> bool:
        """Completed with a reward: what ``early_stop_at`` counts. What a trainer does
        with a session is :func:`polar.rollout.failure.session_use`'s to say."""
        return self.status is SessionStatus.COMPLETED and self.reward is not None


def inferred_failure(status: SessionStatus) -> FailureReason | None:
    """The failure an ended session without a recorded reason had: what its status
    meant before reasons were recorded (an ERROR could be anything: ``unknown``)."""
    match status:
        case SessionStatus.TIMEOUT:
            return FailureReason.TIMEOUT
        case SessionStatus.CANCELLED:
            return FailureReason.CANCELLED
        case SessionStatus.ERROR:
            return FailureReason.UNKNOWN
        case _:
            return None


class SessionView(_Model):
    session_id: str
    sample_index: int
    status: SessionStatus
    node_id: str | None = None
    reward: float | None = None
    error: str | None = None
    failure: FailureReason | None = None
    replaced_by: str | None = None
    """The session resampled in its place (the infrastructure failed it and the
    group was refilled)."""


class TaskView(_Model):
    task_id: str
    task: str
    """The dataset task's id."""
    group_id: str
    status: TaskStatus
    harness: str
    num_samples: int
    created_at: float
    finished_at: float | None = None
    sessions: list[SessionView] = Field(default_factory=list)
    counts: dict[str, int] = Field(default_factory=dict)
    mean_reward: float | None = None
    callback_error: str | None = None
    access_token: str | None = None
    """Only in the answer to the submission: a token that reads this task (its
    view, result and events) and nothing else, to hand to whoever consumes it."""


class TaskResult(_Model):
    task_id: str
    task: str
    group_id: str
    status: TaskStatus
    policy_version: int | None = None
    results: list[SessionResult]
    """Every session's result, by sample index (replaced sessions included)."""
    replaced: list[str] = Field(default_factory=list)
    """Sessions that failed and were resampled (their results are still listed; no
    trainer uses them)."""
    usable: int
    mean_reward: float | None = None

    @property
    def current(self) -> list[SessionResult]:
        """The group's sessions by sample index, without those replaced by a resample
        (what trainers and evaluations use)."""
        replaced = set(self.replaced)
        return sorted(
            (r for r in self.results if r.session_id not in replaced),
            key=lambda r: r.sample_index,
        )


class NodeCapacity(_Model):
    prepare: int = Field(default=2, ge=1)
    run: int = Field(default=4, ge=1)
    postrun: int = Field(default=2, ge=1)
    ahead: int = Field(default=2, ge=0)
    """Sessions prepared ahead of a free agent slot."""

    @property
    def sessions(self) -> int:
        """Sessions a node takes at once (running or prepared ahead)."""
        return self.run + self.ahead


class GatewayAccess(_Model):
    """What a trainer needs of a node's gateway to push weights: where it listens and
    its admin token (the rollout server hands it out under the control token,
    ``GET /gateways``, and never stores it)."""

    node_id: str
    url: str
    admin_token: str = Field(min_length=16, repr=False)


class NodeRegistration(_Model):
    node_id: str = Field(pattern=ID_PATTERN)
    url: str
    capacity: NodeCapacity = Field(default_factory=NodeCapacity)
    heartbeat_interval_s: float = Field(default=5.0, gt=0)
    gateway: GatewayAccess | None = Field(default=None, repr=False)
    """The node's gateway, for trainers (``GET /gateways``); not stored."""


class NodeHeartbeat(_Model):
    sessions: dict[str, SessionStatus] = Field(default_factory=dict)
    """Every session the node holds (running, or finished and not yet acknowledged)."""
    engine_error: str | None = None
    """Why the node's inference engine did not answer its last check; None when it did."""


class HeartbeatReply(_Model):
    """What the server wants of the sessions a heartbeat listed."""

    forget: list[str] = Field(default_factory=list)
    """Finished sessions whose results the server holds."""
    cancel: list[str] = Field(default_factory=list)
    """Sessions the server does not want (unknown to it, or of cancelled tasks)."""


class NodeView(_Model):
    node_id: str
    url: str
    capacity: NodeCapacity
    healthy: bool
    """The node answers its heartbeats and its engine answers the node."""
    draining: bool
    active: int
    last_seen: float
    engine_error: str | None = None
    """Why the node's engine did not answer the node's last check, as it reported."""
