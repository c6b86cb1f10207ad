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
  capture's count of the prompt, :class:`~polar.proxy.call.capture.PreflightFailed`)
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
  (:class:`~polar.proxy.control.sessions.CallTracker`), the barrier a trajectory build
  waits on;
* every call goes to the engine with explicit sampling settings, the
  session's policy enforced (:mod:`polar.proxy.call.behaviour`), and its record
  says what they were and what the engine's logprobs are of.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator
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
from polar.proxy.call.behaviour import SamplingRules
from polar.proxy.call.capture import Capture, PreflightFailed, PreparedCall
from polar.proxy.control.gate import Gate
from polar.proxy.control.sessions import CallTracker, Session
from polar.proxy.engines.base import SESSION_HEADER
from polar.proxy.errors import EngineError, EngineProtocolError, StoreUnavailable
from polar.proxy.logtext import describe
from polar.proxy.render.splice import PastCall, Transcript, Transcripts, lineage_of
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
    """One attempt of one call: its engine call prepared, its row written, its
    events relayed and its outcome recorded (:meth:`events`), and the record
    each of those writes is made of."""

    call: CallInput
    seq: int
    attempt: int
    policy_version: int
    transcript: Transcript
    capture: Capture
    store: SqliteStore
    calls: CallTracker
    prepared: PreparedCall = field(init=False)
    acc: Accumulator = field(init=False)
    engine_started: float = field(init=False)
    first_token: float | None = None
    sent_any: bool = False
    """Whether a delta was yielded to the client (a failure after one is never retried)."""
    finished: bool = False
    """Whether the ``Finish`` event was yielded (its outcome written before)."""
    failure: EngineError | None = None
    """The engine error this attempt failed with, recorded; the relay retries it or raises it."""

    async def events(self) -> AsyncGenerator[EngineEvent, None]:
        """Prepare, record and make the engine call, yielding its events. Ends after
        the ``Finish`` event, or with :attr:`failure` set once an engine error is
        recorded; anything else is recorded (:meth:`_outcome`) and raised."""
        if not await self._prepare():
            return
        await self._begin()
        # The engine's events are closed before the outcome is written.
        async with self._outcome(), contextlib.aclosing(self.prepared.events) as events:
            async for event in events:
                if isinstance(event, Finish):
                    yield await self._finish(event)
                    return
                yield self._took(event)
            raise EngineProtocolError("engine stream ended without finishing the turn")

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

    async def _prepare(self) -> bool:
        """Build the engine call; False when the engine request before it failed
        (the attempt recorded failed at once, with the request that failed)."""
        started = time.time()
        headers = {SESSION_HEADER: self.call.session.id, "x-request-id": self.key}
        try:
            self.prepared = await self.capture.prepare(
                self.call.request, self.transcript, headers=headers
            )
        except PreflightFailed as failed:
            self.prepared = PreparedCall(body=failed.body, events=_no_events())
            self.acc = Accumulator()
            self.engine_started = started
            await self._failed(failed.error, whole=True)
            return False
        self.acc = Accumulator(self.prepared.prompt_ids, self.prepared.packed_prompt)
        self.engine_started = time.time()
        return True

    async def _begin(self) -> None:
        """The call's row, written before the engine is called."""
        prepared = self.prepared
        try:
            await self._write(
                self.record(RecordStatus.IN_FLIGHT),
                begin=True,
                prompt=self.acc.packed_prompt() if prepared.prompt_ids else None,
            )
        except BaseException:
            await prepared.events.aclose()  # never started: nothing reached the engine
            raise

    def _took(self, event: PromptTokens | Delta) -> PromptTokens | Delta:
        """``event``, added to what the record will hold."""
        if isinstance(event, Delta):
            if self.first_token is None and event.token_ids:
                self.first_token = time.time()
            self.acc.add(event)
            self.sent_any = True
        else:
            self.acc.prompt_ids = event.ids
        return event

    async def _finish(self, event: Finish) -> Finish:
        """The outcome committed, and the finish event to yield last."""
        done = self.record(RecordStatus.COMPLETED, finish=event)
        past = self.past(done)
        await self._write(done, ids=past.full)
        self.transcript.add(past)
        self.finished = True
        # The message recorded is the message replied.
        return dataclasses.replace(event, message=past.output)

    @contextlib.asynccontextmanager
    async def _outcome(self) -> AsyncIterator[None]:
        """Writes the outcome of an engine call that did not finish: an engine
        error failed (kept in :attr:`failure`, not raised), a client gone or a
        session ended aborted, a bug failed; the row of an outcome that could not
        be written stays in flight."""
        try:
            yield
        except EngineError as exc:
            await self._failed(exc)
        except (asyncio.CancelledError, GeneratorExit):
            if not self.finished:  # else closed after the last event: the outcome is written
                await self._aborted()
            raise
        except StoreUnavailable:
            raise
        except Exception as exc:
            # A bug: the client gets a 500, the call a record.
            error = CallError(kind=ErrorKind.INTERNAL, message=describe(exc))
            with contextlib.suppress(StoreUnavailable):
                await self._write(self.record(RecordStatus.FAILED, error=error))
            raise

    async def _failed(self, exc: EngineError, *, whole: bool = False) -> None:
        error = CallError(kind=exc.kind, message=exc.message, status=exc.status)
        await self._write(self.record(RecordStatus.FAILED, error=error), whole=whole)
        self.failure = exc

    async def _aborted(self) -> None:
        """The client went away, or its session ended: keep what was sampled. The
        write is shielded from this task's cancellation."""
        ended = self.calls.was_cut(asyncio.current_task())
        error = CallError(
            kind=ErrorKind.SESSION_ENDED if ended else ErrorKind.CLIENT_DISCONNECTED,
            message=(
                "the session's harness ended while the call was in flight"
                if ended
                else "client disconnected before the turn finished"
            ),
        )
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.shield(self._write(self.record(RecordStatus.ABORTED, error=error)))

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
                await self.store.begin(record, prompt=prompt)
            elif whole:
                await self.store.append(record)
            else:
                await self.store.finish(record, ids=ids)
        except StoreError as exc:
            raise StoreUnavailable(f"the gateway cannot record calls right now: {exc}") from None

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

    async def run(self, call: CallInput) -> AsyncGenerator[EngineEvent, None]:
        """Serve one call: admit it, then make attempts until one finishes or fails
        for good. Yields the prompt ids once known (again for each attempt),
        deltas as they arrive, and the finish event last."""
        seq = call.session.next_seq()
        call = dataclasses.replace(
            call, request=self.sampling.apply(call.request, call.session.sampling)
        )
        transcript = self._transcripts.get(call.session.id)
        async with contextlib.AsyncExitStack() as stack:
            # Counted for its session and holding a gate slot until its outcome is written.
            stack.enter_context(self._calls.track(call.session.id))
            version = await stack.enter_async_context(self._gate.admit(wait_s=self._pause_wait))
            for number in itertools.count(1):
                this = _Attempt(
                    call, seq, number, version, transcript, self.capture, self._store, self._calls
                )
                # Closed with the call, so a call closed mid-stream (its client
                # gone) closes the attempt, which records it aborted.
                events = await stack.enter_async_context(contextlib.aclosing(this.events()))
                async for event in events:
                    yield event
                if this.failure is None:
                    return  # finished: the Finish event was the last
                if not await self._retrying(this.failure, this):
                    raise this.failure

    async def _retrying(self, exc: EngineError, this: _Attempt) -> bool:
        """Whether the failed attempt is tried again (after its backoff): a transient
        failure before anything reached the client, with attempts left."""
        if not (exc.retryable and not this.sent_any and this.attempt < self._max_attempts):
            return False
        _log.warning("call %s failed, retrying: %s", this.key, exc.message[:300])
        if exc.backoff:
            await asyncio.sleep(self._backoff * 2 ** (this.attempt - 1))
        return True


async def _no_events() -> AsyncGenerator[EngineEvent, None]:
    """The events of an attempt that never reached its call (never iterated)."""
    none: tuple[EngineEvent, ...] = ()
    for event in none:
        yield event


def _partial_usage(acc: Accumulator) -> Usage:
    return Usage(prompt_tokens=len(acc.prompt_ids), completion_tokens=len(acc.output_ids))
