"""The completion record: what the gateway keeps of every call that reached an engine."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from polar.ir.behaviour import Behaviour
from polar.ir.completion import FinishReason, Usage
from polar.ir.messages import JsonObject, Message, RequestEdit


class Dialect(StrEnum):
    OPENAI_CHAT = "openai_chat"
    OPENAI_RESPONSES = "openai_responses"
    ANTHROPIC_MESSAGES = "anthropic_messages"
    GEMINI = "gemini"


class CaptureMode(StrEnum):
    ENGINE_RENDERED = "engine_rendered"
    TOKEN_IN_TOKEN_OUT = "token_in_token_out"


class RecordStatus(StrEnum):
    COMPLETED = "completed"
    """The engine finished the turn and the client was answered."""
    FAILED = "failed"
    """The engine call failed (HTTP error, timeout, connection, bad response)."""
    ABORTED = "aborted"
    """The client went away before the turn finished; output holds what was sampled."""
    IN_FLIGHT = "in_flight"
    """Dispatched to the engine and not finished yet. The row is written before
    the engine is called, so a call survives the gateway's death; the next start
    marks what was left in flight ``interrupted``."""
    INTERRUPTED = "interrupted"
    """The gateway died (crash, ``kill -9``, power loss) while the call was in
    flight; output holds what was stored of it (the prompt, when the gateway
    rendered it), never a finished turn."""


class ErrorKind(StrEnum):
    ENGINE_HTTP = "engine_http"
    ENGINE_TIMEOUT = "engine_timeout"
    ENGINE_UNAVAILABLE = "engine_unavailable"
    ENGINE_PROTOCOL = "engine_protocol"
    CLIENT_DISCONNECTED = "client_disconnected"
    SESSION_ENDED = "session_ended"
    """The session's harness had ended; the gateway cut the orphaned call off."""
    GATEWAY_STOPPED = "gateway_stopped"
    """The gateway process stopped while the call was in flight."""
    INTERNAL = "internal"


class PromptOrigin(StrEnum):
    """How a call's prompt relates to the session's earlier calls."""

    FRESH = "fresh"
    """No earlier call shares a token with it (first call, a new conversation)."""
    EXTENDS = "extends"
    """It is, token for token, an earlier call's prompt + sampled output + new tokens."""
    REWRITTEN = "rewritten"
    """The conversation extends an earlier call's, but its tokens do not: the
    template or the harness re-rendered history (e.g. dropped reasoning)."""
    DIVERGED = "diverged"
    """The conversation extends no earlier call (history edited, dropped or
    compacted, or another conversation); it shares ``shared_tokens`` with one."""


@dataclass(frozen=True, slots=True)
class PromptLineage:
    """Where a prompt came from, measured in tokens against the session's calls.

    ``base_seq``/``base_attempt`` name the earlier call it is compared with;
    the prompt agrees with that call's prompt + output for ``shared_tokens`` of
    its ``base_tokens`` tokens, so a drift starts at token ``shared_tokens``.
    ``spliced`` is true when the gateway put the base call's raw sampled ids
    into this prompt (gateway-rendered capture).
    """

    origin: PromptOrigin
    base_seq: int | None = None
    base_attempt: int | None = None
    shared_tokens: int = 0
    base_tokens: int = 0
    spliced: bool = False


@dataclass(frozen=True, slots=True)
class MalformedToolCall:
    """A tool call the model wrote that could not be parsed; its text went to the client."""

    raw: str
    reason: str


class DeliveryIssue(StrEnum):
    """How what a client was (or would have been) handed differs from the sampled text."""

    ENGINE_TEXT_DIFFERS = "engine_text_differs"
    """The engine's parser gave text or reasoning that is not the sampled text's
    (text after a malformed ``<tool_call>`` swallowed, a stray ``</think>`` stripped)."""
    ENGINE_TOOL_CALLS_DIFFER = "engine_tool_calls_differ"
    """The engine's parser gave other tool calls (names, arguments, count) than
    the sampled text holds."""
    ENGINE_ARGUMENTS_NOT_JSON = "engine_arguments_not_json"
    """The engine streamed tool-call arguments that do not join to valid JSON."""
    STREAMED_CALL_WITHDRAWN = "streamed_call_withdrawn"
    """A tool call began streaming, then did not parse: the client was sent its
    start as a call, then its text (an OpenAI chat stream cannot withdraw a call;
    the recorded message does)."""
    TOOL_NOT_OFFERED = "tool_not_offered"
    """A well-formed tool call names a tool the request did not offer."""
    ARGUMENTS_MISSING = "arguments_missing"
    """A tool call was written without arguments; the client got ``{}``."""


@dataclass(frozen=True, slots=True)
class DeliveryFlag:
    """One difference between the sampled text and what was delivered for it."""

    issue: DeliveryIssue
    detail: str


@dataclass(frozen=True, slots=True)
class CallError:
    kind: ErrorKind
    message: str
    status: int | None = None


@dataclass(frozen=True, slots=True)
class Timings:
    """Wall-clock instants (Unix seconds) of one call's life."""

    arrived: float
    engine_started: float | None = None
    first_token: float | None = None
    finished: float | None = None


@dataclass(frozen=True, slots=True)
class CompletionRecord:
    """One engine call of one session.

    ``seq`` is the session's monotonic sequence number, assigned when the call
    arrived; ``attempt`` counts the gateway's own retries of that call (1 for the
    first). Together with ``session_id`` they identify the record.
    """

    session_id: str
    seq: int
    attempt: int
    status: RecordStatus
    dialect: Dialect
    capture: CaptureMode
    engine: str
    model: str
    policy_version: int
    stream: bool
    original_request: JsonObject
    engine_request: JsonObject
    timings: Timings
    prompt_ids: tuple[int, ...] = ()
    output_ids: tuple[int, ...] = ()
    output_logprobs: tuple[float, ...] = ()
    finish_reason: FinishReason | None = None
    message: Message | None = None
    usage: Usage | None = None
    error: CallError | None = None
    lineage: PromptLineage | None = None
    malformed_tool_calls: tuple[MalformedToolCall, ...] = ()
    edits: tuple[RequestEdit, ...] = ()
    """Changes the gateway made to the request before rendering it."""
    delivery_flags: tuple[DeliveryFlag, ...] = ()
    """Where delivery and the sampled ids disagree (see :class:`DeliveryIssue`)."""
    behaviour: Behaviour | None = None
    """The sampling settings the engine drew the output with, and what its logprobs
    are of (:mod:`polar.ir.behaviour`); ``None`` on records made before they were kept."""

    @property
    def key(self) -> str:
        return f"{self.session_id}/{self.seq}.{self.attempt}"
