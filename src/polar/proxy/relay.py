"""One call's trip through the gateway: admit, call the engine, stream, record.

The relay is dialect-neutral. A dialect's route translates the client's body
to an IR request, iterates :meth:`Relay.run`, and encodes each event for its
client. The relay guarantees:

* every engine call that was attempted is in the store *before* the engine is
  called (status ``in_flight``, see :mod:`polar.proxy.store.sqlite`), and its
  outcome is written over that row: completed, failed (with the error and any
  partial output) or aborted (client went away, or its session ended); a
  gateway killed mid-call leaves the row for the next start to mark
  ``interrupted``;
* an attempt whose engine request before the call failed (engine-rendered
  capture's count of the prompt, :class:`~polar.proxy.capture.PreflightFailed`)
  is recorded failed, with the request that failed, and retried like a call;
* the outcome of a completed call is committed *before* the ``Finish`` event
  is yielded, so the dialect sends its final bytes only after the call is
  durable, and the outcome of a failed or aborted call before the error
  reaches the client (or the call's task ends);
* a store that cannot write makes the call fail at once with a 503, before the
  engine is called; it never hangs;
* a failure before any token reached the client is retried when the error is
  transient (engine unreachable, a pooled connection reset, 502/503), each
  attempt its own record with its own ``x-request-id``;
* a session's calls are counted from arrival until their outcome is written
  (:class:`~polar.proxy.sessions.CallTracker`), the barrier a trajectory build
  waits on;
* every call goes to the engine with explicit sampling settings, the
  session's policy enforced (:mod:`polar.proxy.behaviour`), and its record
  says what they were and what the engine's logprobs are of.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from polar.ir import (
    CallError,
    ChatRequest,
    CompletionRecord,
    Delta,
    Dialect,
    EngineEvent,
    ErrorKind,
    Finish,
    JsonObject,
    Message,
    Part,
    PromptTokens,
    ReasoningPart,
    RecordStatus,
    Role,
    TextPart,
    Timings,
    ToolCall,
    Usage,
)
from polar.ir.tokenids import TokenRun, pack
from polar.proxy.behaviour import SamplingRules
from polar.proxy.capture import Capture, PreflightFailed, PreparedCall
from polar.proxy.engines.base import SESSION_HEADER
from polar.proxy.errors import EngineError, EngineProtocolError, StoreUnavailable
from polar.proxy.gate import Gate
from polar.proxy.logtext import describe
from polar.proxy.render.splice import PastCall, Transcript, Transcripts, lineage_of
from polar.proxy.sessions import CallTracker, Session
from polar.proxy.store import SqliteStore, StoreError

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CallInput:
    session: Session
    dialect: Dialect
    request: ChatRequest
    original: JsonObject
    arrived: float


@dataclass(slots=True)
class _ToolCallParts:
    id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class Accumulator:
    """Adds up deltas into the ids, logprobs and assistant message of one call."""

    def __init__(self, prompt_ids: tuple[int, ...] = (), packed: bytes | None = None) -> None:
        self.prompt_ids = prompt_ids
        self._packed: tuple[tuple[int, ...], bytes] | None = (
            None if packed is None else (prompt_ids, packed)
        )
        self.output_ids: list[int] = []
        self.logprobs: list[float] = []
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, _ToolCallParts] = {}

    def add(self, delta: Delta) -> None:
        self.output_ids.extend(delta.token_ids)
        self.logprobs.extend(delta.logprobs)
        if delta.text:
            self._text.append(delta.text)
        if delta.reasoning:
            self._reasoning.append(delta.reasoning)
        for piece in delta.tool_calls:
            if piece.discard:
                self._calls.pop(piece.index, None)
                continue
            parts = self._calls.setdefault(piece.index, _ToolCallParts())
            if piece.id:
                parts.id = piece.id
            if piece.name:
                parts.name += piece.name
            if piece.arguments:
                parts.arguments.append(piece.arguments)

    def packed_prompt(self) -> bytes:
        """The prompt ids packed (once per prompt)."""
        if self._packed is None or self._packed[0] is not self.prompt_ids:
            self._packed = (self.prompt_ids, pack(self.prompt_ids))
        return self._packed[1]

    def message(self) -> Message:
        parts: list[Part] = []
        if self._reasoning:
            parts.append(ReasoningPart("".join(self._reasoning)))
        if self._text:
            parts.append(TextPart("".join(self._text)))
        for index in sorted(self._calls):
            call = self._calls[index]
            parts.append(
                ToolCall(
                    id=call.id or f"call_{secrets.token_hex(12)}",
                    name=call.name,
                    arguments="".join(call.arguments),
                )
            )
        return Message(role=Role.ASSISTANT, parts=tuple(parts))


@dataclass(slots=True)
class _Attempt:
    """One attempt of one call: what its record is made of."""

    call: CallInput
    seq: int
    attempt: int
    policy_version: int
    prepared: PreparedCall
    capture: Capture
    transcript: Transcript
    acc: Accumulator
    engine_started: float = field(default_factory=time.time)
    first_token: float | None = None

    def record(
        self,
        status: RecordStatus,
        *,
        finish: Finish | None = None,
        error: CallError | None = None,
    ) -> CompletionRecord:
        """The attempt's record. Never raises: a record that cannot be built in
        full (a bug, or output the gateway cannot read) is still written, bare,
        with the reason."""
        try:
            return self._record(status, finish, error)
        except Exception as exc:
            _log.error("record %s could not be built in full: %s", self.key, describe(exc))
            reason = CallError(
                kind=ErrorKind.INTERNAL,
                message=f"the record could not be built in full: {describe(exc)}",
            )
            return self._bare(
                status if status is RecordStatus.IN_FLIGHT else RecordStatus.FAILED, error or reason
            )

    def past(self, done: CompletionRecord) -> PastCall:
        """The completed call as a base for the session's later prompts, its ids
        stored as a delta on the call its prompt continues (when still known)."""
        lineage = done.lineage
        on = (
            self.transcript.find(lineage.base_seq, lineage.base_attempt)
            if lineage is not None and lineage.base_seq is not None
            else None
        )
        return PastCall.of(
            self.seq,
            self.attempt,
            self.call.request.messages,
            self.acc.packed_prompt(),
            done.output_ids,
            done.message or self.acc.message(),
            on=on,
        )

    @property
    def key(self) -> str:
        return f"{self.call.session.id}/{self.seq}.{self.attempt}"

    def _record(
        self, status: RecordStatus, finish: Finish | None, error: CallError | None
    ) -> CompletionRecord:
        acc = self.acc
        lineage = self.prepared.lineage
        if lineage is None and acc.prompt_ids:
            lineage = lineage_of(acc.packed_prompt(), self.call.request.messages, self.transcript)
        running = status is RecordStatus.IN_FLIGHT
        return CompletionRecord(
            **self._identity(status),
            timings=Timings(
                arrived=self.call.arrived,
                engine_started=self.engine_started,
                first_token=self.first_token,
                finished=None if running else time.time(),
            ),
            prompt_ids=acc.prompt_ids,
            output_ids=tuple(acc.output_ids),
            output_logprobs=tuple(acc.logprobs),
            finish_reason=finish.reason if finish else None,
            message=None if running else acc.message(),
            usage=finish.usage if finish else (None if running else _partial_usage(acc)),
            error=error,
            lineage=lineage,
            malformed_tool_calls=tuple(self.prepared.malformed),
            edits=self.call.request.edits + self.prepared.edits,
            delivery_flags=tuple(self.prepared.delivery_flags),
        )

    def _bare(self, status: RecordStatus, error: CallError) -> CompletionRecord:
        return CompletionRecord(
            **self._identity(status),
            timings=Timings(arrived=self.call.arrived, engine_started=self.engine_started),
            error=error,
        )

    def _identity(self, status: RecordStatus) -> dict[str, Any]:
        """The fields every record of this attempt has, whatever its outcome."""
        return {
            "session_id": self.call.session.id,
            "seq": self.seq,
            "attempt": self.attempt,
            "status": status,
            "dialect": self.call.dialect,
            "capture": self.capture.mode,
            "engine": self.capture.engine_name,
            "model": self.capture.model,
            "policy_version": self.policy_version,
            "stream": self.call.request.stream,
            "original_request": self.call.original,
            "engine_request": self.prepared.body,
            "behaviour": self.prepared.behaviour,
        }


class Relay:
    def __init__(
        self,
        capture: Capture,
        store: SqliteStore,
        gate: Gate,
        transcripts: Transcripts,
        calls: CallTracker,
        *,
        max_attempts: int,
        retry_backoff_s: float,
        pause_wait_s: float,
        sampling: SamplingRules | None = None,
    ) -> None:
        self.capture = capture
        self.sampling = sampling or SamplingRules()
        self._store = store
        self._gate = gate
        self._transcripts = transcripts
        self._calls = calls
        self._max_attempts = max_attempts
        self._backoff = retry_backoff_s
        self._pause_wait = pause_wait_s

    async def _write(
        self,
        record: CompletionRecord,
        *,
        begin: bool = False,
        whole: bool = False,
        prompt: bytes | None = None,
        ids: TokenRun | None = None,
    ) -> None:
        """``begin``: the row of a call about to reach the engine; ``whole``: the
        only write of an attempt (a failed preflight); else the outcome."""
        try:
            if begin:
                await self._store.begin(record, prompt=prompt)
            elif whole:
                await self._store.append(record)
            else:
                await self._store.finish(record, ids=ids)
        except StoreError as exc:
            raise StoreUnavailable(f"the gateway cannot record calls right now: {exc}") from None

    async def _retrying(self, exc: EngineError, this: _Attempt, *, sent_any: bool) -> bool:
        """Whether the failed attempt is tried again (after its backoff): a transient
        failure before anything reached the client, with attempts left."""
        if not (exc.retryable and not sent_any and this.attempt < self._max_attempts):
            return False
        _log.warning("call %s failed, retrying: %s", this.key, exc.message[:300])
        if exc.backoff:
            await asyncio.sleep(self._backoff * 2 ** (this.attempt - 1))
        return True

    async def run(self, call: CallInput) -> AsyncGenerator[EngineEvent, None]:
        """Serve one call; yields the prompt ids once known (again for each
        attempt), deltas as they arrive, and the finish event last."""
        seq = call.session.next_seq()
        call = dataclasses.replace(
            call, request=self.sampling.apply(call.request, call.session.sampling)
        )
        transcript = self._transcripts.get(call.session.id)
        with self._calls.track(call.session.id):
            async with self._gate.admit(wait_s=self._pause_wait) as policy_version:
                attempt = 0
                while True:
                    attempt += 1
                    started = time.time()
                    try:
                        prepared = await self.capture.prepare(
                            call.request,
                            transcript,
                            headers={
                                SESSION_HEADER: call.session.id,
                                "x-request-id": f"{call.session.id}/{seq}.{attempt}",
                            },
                        )
                    except PreflightFailed as failed:
                        exc = failed.error
                        this = _Attempt(
                            call=call,
                            seq=seq,
                            attempt=attempt,
                            policy_version=policy_version,
                            prepared=PreparedCall(body=failed.body, events=_no_events()),
                            capture=self.capture,
                            transcript=transcript,
                            acc=Accumulator(),
                            engine_started=started,
                        )
                        error = CallError(kind=exc.kind, message=exc.message, status=exc.status)
                        await self._write(this.record(RecordStatus.FAILED, error=error), whole=True)
                        if await self._retrying(exc, this, sent_any=False):
                            continue
                        raise exc from None
                    this = _Attempt(
                        call=call,
                        seq=seq,
                        attempt=attempt,
                        policy_version=policy_version,
                        prepared=prepared,
                        capture=self.capture,
                        transcript=transcript,
                        acc=Accumulator(prepared.prompt_ids, prepared.packed_prompt),
                    )
                    try:
                        await self._write(
                            this.record(RecordStatus.IN_FLIGHT),
                            begin=True,
                            prompt=this.acc.packed_prompt() if prepared.prompt_ids else None,
                        )
                    except BaseException:
                        await prepared.events.aclose()  # never started: nothing reached the engine
                        raise
                    acc = this.acc
                    sent_any = False
                    finished = False
                    try:
                        async with contextlib.aclosing(prepared.events) as events:
                            async for event in events:
                                if isinstance(event, PromptTokens):
                                    acc.prompt_ids = event.ids
                                    yield event
                                elif isinstance(event, Delta):
                                    if this.first_token is None and event.token_ids:
                                        this.first_token = time.time()
                                    acc.add(event)
                                    sent_any = True
                                    yield event
                                else:
                                    done = this.record(RecordStatus.COMPLETED, finish=event)
                                    past = this.past(done)
                                    await self._write(done, ids=past.full)
                                    transcript.add(past)
                                    finished = True
                                    # The message recorded is the message replied.
                                    yield dataclasses.replace(event, message=past.output)
                                    return
                        raise EngineProtocolError("engine stream ended without finishing the turn")
                    except EngineError as exc:
                        error = CallError(kind=exc.kind, message=exc.message, status=exc.status)
                        await self._write(this.record(RecordStatus.FAILED, error=error))
                        if await self._retrying(exc, this, sent_any=sent_any):
                            continue
                        raise
                    except (asyncio.CancelledError, GeneratorExit):
                        if finished:
                            raise  # closed after the last event: the outcome is written
                        # The client went away, or its session ended: keep what was
                        # sampled. The write is shielded from this task's cancellation.
                        ended = self._calls.was_cut(asyncio.current_task())
                        error = CallError(
                            kind=(
                                ErrorKind.SESSION_ENDED if ended else ErrorKind.CLIENT_DISCONNECTED
                            ),
                            message=(
                                "the session's harness ended while the call was in flight"
                                if ended
                                else "client disconnected before the turn finished"
                            ),
                        )
                        with contextlib.suppress(Exception, asyncio.CancelledError):
                            await asyncio.shield(
                                self._write(this.record(RecordStatus.ABORTED, error=error))
                            )
                        raise
                    except StoreUnavailable:
                        raise  # the outcome could not be written; the row stays in flight
                    except Exception as exc:
                        # A bug: the client gets a 500, the call a record.
                        error = CallError(kind=ErrorKind.INTERNAL, message=describe(exc))
                        with contextlib.suppress(StoreUnavailable):
                            await self._write(this.record(RecordStatus.FAILED, error=error))
                        raise


async def _no_events() -> AsyncGenerator[EngineEvent, None]:
    """The events of an attempt that never reached its call (never iterated)."""
    none: tuple[EngineEvent, ...] = ()
    for event in none:
        yield event


def _partial_usage(acc: Accumulator) -> Usage:
    return Usage(prompt_tokens=len(acc.prompt_ids), completion_tokens=len(acc.output_ids))
