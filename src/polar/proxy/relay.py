"""One call's trip through the gateway: admit, call the engine, stream, record.

The relay is dialect-neutral. A dialect's route translates the client's body
to an IR request, iterates :meth:`Relay.run`, and encodes each event for its
client. The relay guarantees:

* every engine call that was attempted becomes a record: completed, failed
  (with the error and any partial output) or aborted (client went away);
* the record of a completed call is committed *before* the ``Finish`` event is
  yielded, so the dialect sends its final bytes only after the call is durable;
* a failure before any token reached the client is retried when the error is
  transient (engine unreachable, 502/503), each attempt recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

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
from polar.proxy.capture import Capture, PreparedCall
from polar.proxy.engines.base import SESSION_HEADER
from polar.proxy.errors import EngineError, EngineProtocolError
from polar.proxy.gate import Gate
from polar.proxy.render.splice import PastCall, Transcripts, lineage_of
from polar.proxy.sessions import Session
from polar.proxy.store import SqliteStore

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

    def __init__(self) -> None:
        self.prompt_ids: tuple[int, ...] = ()
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


class Relay:
    def __init__(
        self,
        capture: Capture,
        store: SqliteStore,
        gate: Gate,
        transcripts: Transcripts,
        *,
        max_attempts: int,
        retry_backoff_s: float,
        pause_wait_s: float,
    ) -> None:
        self.capture = capture
        self._store = store
        self._gate = gate
        self._transcripts = transcripts
        self._max_attempts = max_attempts
        self._backoff = retry_backoff_s
        self._pause_wait = pause_wait_s

    async def run(self, call: CallInput) -> AsyncGenerator[EngineEvent, None]:
        """Serve one call; yields the prompt ids once known, deltas as they arrive,
        and the finish event last."""
        seq = call.session.next_seq()
        transcript = self._transcripts.get(call.session.id)
        messages = call.request.messages
        async with self._gate.admit(wait_s=self._pause_wait) as policy_version:
            attempt = 0
            while True:
                attempt += 1
                engine_call = self.capture.prepare(
                    call.request,
                    transcript,
                    headers={
                        SESSION_HEADER: call.session.id,
                        "x-request-id": f"{call.session.id}/{seq}.{attempt}",
                    },
                )
                acc = Accumulator()
                timings = {"engine_started": time.time(), "first_token": None}

                def record(
                    status: RecordStatus,
                    *,
                    finish: Finish | None = None,
                    error: CallError | None = None,
                    acc: Accumulator = acc,
                    attempt: int = attempt,
                    prepared: PreparedCall = engine_call,
                    timings: dict[str, float | None] = timings,
                ) -> CompletionRecord:
                    lineage = prepared.lineage
                    if lineage is None and acc.prompt_ids:
                        lineage = lineage_of(acc.prompt_ids, messages, transcript)
                    return CompletionRecord(
                        session_id=call.session.id,
                        seq=seq,
                        attempt=attempt,
                        status=status,
                        dialect=call.dialect,
                        capture=self.capture.mode,
                        engine=self.capture.engine_name,
                        model=self.capture.model,
                        policy_version=policy_version,
                        stream=call.request.stream,
                        original_request=call.original,
                        engine_request=prepared.body,
                        timings=Timings(
                            arrived=call.arrived,
                            engine_started=timings["engine_started"],
                            first_token=timings["first_token"],
                            finished=time.time(),
                        ),
                        prompt_ids=acc.prompt_ids,
                        output_ids=tuple(acc.output_ids),
                        output_logprobs=tuple(acc.logprobs),
                        finish_reason=finish.reason if finish else None,
                        message=acc.message(),
                        usage=finish.usage if finish else _partial_usage(acc),
                        error=error,
                        lineage=lineage,
                        malformed_tool_calls=tuple(prepared.malformed),
                        edits=call.request.edits,
                        delivery_flags=tuple(prepared.delivery_flags),
                    )

                sent_any = False
                finished = False
                try:
                    async with contextlib.aclosing(engine_call.events) as events:
                        async for event in events:
                            if isinstance(event, PromptTokens):
                                acc.prompt_ids = event.ids
                                yield event
                            elif isinstance(event, Delta):
                                if timings["first_token"] is None and event.token_ids:
                                    timings["first_token"] = time.time()
                                acc.add(event)
                                sent_any = True
                                yield event
                            else:
                                done = record(RecordStatus.COMPLETED, finish=event)
                                await self._store.append(done)
                                transcript.add(
                                    PastCall(
                                        seq=seq,
                                        attempt=attempt,
                                        messages=messages,
                                        prompt_ids=done.prompt_ids,
                                        output_ids=done.output_ids,
                                        output=done.message or acc.message(),
                                    )
                                )
                                finished = True
                                yield event
                                return
                    raise EngineProtocolError("engine stream ended without finishing the turn")
                except EngineError as exc:
                    failed = record(
                        RecordStatus.FAILED,
                        error=CallError(kind=exc.kind, message=exc.message, status=exc.status),
                    )
                    await self._store.append(failed)
                    if exc.retryable and not sent_any and attempt < self._max_attempts:
                        _log.warning(
                            "session %s call %d attempt %d failed, retrying: %s",
                            call.session.id,
                            seq,
                            attempt,
                            exc.message,
                        )
                        await asyncio.sleep(self._backoff * 2 ** (attempt - 1))
                        continue
                    raise
                except (asyncio.CancelledError, GeneratorExit):
                    if finished:
                        raise  # closed after the last event: the record is already written
                    # The client went away. Keep what was sampled; do not await
                    # (this task is being cancelled), the store writes it anyway.
                    self._store.append_nowait(
                        record(
                            RecordStatus.ABORTED,
                            finish=None,
                            error=CallError(
                                kind=ErrorKind.CLIENT_DISCONNECTED,
                                message="client disconnected before the turn finished",
                            ),
                        )
                    )
                    raise
                except Exception as exc:
                    # A bug or a store failure: the client gets a 500, the call a record.
                    self._store.append_nowait(
                        record(
                            RecordStatus.FAILED,
                            error=CallError(kind=ErrorKind.INTERNAL, message=repr(exc)),
                        )
                    )
                    raise


def _partial_usage(acc: Accumulator) -> Usage:
    return Usage(prompt_tokens=len(acc.prompt_ids), completion_tokens=len(acc.output_ids))
