"""Reading engine replies defensively: every value the gateway uses is checked.

An engine reply is input like any other. A reply of the wrong shape (``[]``,
``null``, ``{"choices": ["x"]}``), a token id that is negative, wider than 32
bits or not an integer, a logprob that is not a number: each becomes an
:class:`~polar.proxy.errors.EngineProtocolError` naming what was wrong, which
the relay records (``engine_protocol``) and the client sees as a 502 in its
dialect. Nothing an engine sends can reach the record store unchecked.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any, ParamSpec

import orjson

from polar.ir import Delta, EngineEvent, TokenLogprob, ToolCallDelta
from polar.ir.tokenids import pack
from polar.proxy.engines.transport import SSEEvent
from polar.proxy.errors import EngineError, EngineProtocolError
from polar.proxy.logtext import brief, describe

MAX_TOKEN_ID = (1 << 32) - 1

P = ParamSpec("P")


def obj(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise EngineProtocolError(f"engine sent {what} that is not an object: {brief(value)}")
    return value


def optional_obj(value: Any, what: str) -> dict[str, Any]:
    """An object, or ``{}`` for a missing (null) one."""
    return {} if value is None else obj(value, what)


def array(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise EngineProtocolError(f"engine sent {what} that is not a list: {brief(value)}")
    return value


def optional_array(value: Any, what: str) -> list[Any]:
    return [] if value is None else array(value, what)


def text(value: Any, what: str) -> str:
    """A string; ``None`` reads as empty."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise EngineProtocolError(f"engine sent {what} that is not a string: {brief(value)}")
    return value


def optional_text(value: Any, what: str) -> str | None:
    return None if value is None else text(value, what)


def token_id(value: Any, what: str) -> int:
    if type(value) is not int or not 0 <= value <= MAX_TOKEN_ID:
        raise EngineProtocolError(f"engine sent {what} that is not a token id: {brief(value)}")
    return value


def token_ids(value: Any, what: str) -> tuple[int, ...]:
    """A list of token ids (non-negative integers below 2**32); ``None`` reads as none.

    Checked in C (a prompt has tens of thousands): every item an exact ``int``
    (``bool`` is a subclass, and not an id) that fits ``uint32``; the item at
    fault is named by the slow path."""
    items = optional_array(value, what)
    try:
        pack(items)
    except (TypeError, OverflowError):
        pass
    else:
        if {*map(type, items)} <= {int}:
            return tuple(items)
    return tuple(token_id(v, what) for v in items)


def number(value: Any, what: str) -> float:
    if type(value) not in (int, float):  # bool is an int subclass, and not a number here
        raise EngineProtocolError(f"engine sent {what} that is not a number: {brief(value)}")
    return float(value)


def numbers(values: list[Any], what: str) -> tuple[float, ...]:
    """:func:`number` of each value, checked in one pass in C."""
    if not {*map(type, values)} <= {int, float}:
        for value in values:
            number(value, what)
    return tuple(map(float, values))


def count(value: Any, what: str) -> int:
    if type(value) is not int or value < 0:
        raise EngineProtocolError(f"engine sent {what} that is not a count: {brief(value)}")
    return value


def stop_reason(value: Any) -> str | int | None:
    """What stopped a turn: a stop string, a stop token id, or nothing."""
    if value is None or isinstance(value, str) or type(value) is int:
        return value
    raise EngineProtocolError(
        f"engine sent a stop reason that is not a string or an id: {brief(value)}"
    )


def json_reply(data: bytes, what: str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise EngineProtocolError(f"engine sent {what} that is not JSON: {exc}") from exc


def error_of(doc: Mapping[str, Any]) -> str:
    """The message of an in-stream error object, bounded."""
    error = doc.get("error")
    message = error.get("message") if isinstance(error, dict) else error
    return brief(message) if not isinstance(message, str) else message[:500]


class Steps:
    """Sampled steps gathered as a stream is read, handed on as one delta by
    :meth:`take` (a network read's worth: see :func:`read_stream`)."""

    def __init__(self, details: bool) -> None:
        """``details``: the deltas carry per-token detail (each step gives it)."""
        self._details = details
        self._any = False
        self._ids: list[int] = []
        self._logprobs: list[float] = []
        self._detail: list[TokenLogprob] = []
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._calls: list[ToolCallDelta] = []

    def add(
        self,
        ids: tuple[int, ...],
        logprobs: tuple[float, ...],
        detail: tuple[TokenLogprob, ...] | None,
        text: str = "",
        reasoning: str = "",
        calls: tuple[ToolCallDelta, ...] = (),
    ) -> None:
        self._any = True
        self._ids += ids
        self._logprobs += logprobs
        if detail:
            self._detail += detail
        if text:
            self._text.append(text)
        if reasoning:
            self._reasoning.append(reasoning)
        self._calls += calls

    def take(self) -> list[EngineEvent]:
        """What was added since the last take, as one delta (nothing: none)."""
        if not self._any:
            return []
        delta = Delta(
            token_ids=tuple(self._ids),
            logprobs=tuple(self._logprobs),
            text="".join(self._text),
            reasoning="".join(self._reasoning),
            tool_calls=tuple(self._calls),
            details=tuple(self._detail) if self._details else None,
        )
        self._any = False
        self._ids, self._logprobs, self._detail = [], [], []
        self._text, self._reasoning, self._calls = [], [], []
        return [delta]


async def read_stream(
    bursts: AsyncGenerator[list[SSEEvent], None],
    read: Callable[[bytes], list[EngineEvent]],
    done: Callable[[], bool],
    take: Callable[[], list[EngineEvent]],
) -> AsyncGenerator[EngineEvent, None]:
    """A stream's events, a network read at a time: ``read`` takes each event's
    data and gathers its sampled steps (a :class:`Steps`), returning only the
    events that are not steps; ``take`` then hands on the read's steps as one
    delta, so every layer above (parse, record, encode, write) handles a burst
    in one pass and nothing waits for more to arrive.

    When reading fails, what was read before the failure still comes out first
    (``take`` is called after a failure too), so a reply that fails mid-burst
    keeps its earlier steps. Ends after the read in which ``done()`` became true
    (the engine's end-of-stream marker)."""
    async with contextlib.aclosing(bursts):
        async for burst in bursts:
            events: list[EngineEvent] = []
            error: Exception | None = None
            try:
                for sse in burst:
                    events += read(sse.data)
            except Exception as exc:
                error = exc
            events += take()
            for event in events:
                yield event
            if error is not None:
                raise error
            if done():
                return


def guarded(
    events: Callable[P, AsyncGenerator[EngineEvent, None]],
) -> Callable[P, AsyncGenerator[EngineEvent, None]]:
    """Make any reading error of an adapter's event generator a protocol error.

    The explicit checks above name the problem; this is the net under them, so
    a reply shape nobody anticipated is still a recorded 502, never a 500.
    """

    @functools.wraps(events)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> AsyncGenerator[EngineEvent, None]:
        source = events(*args, **kwargs)
        try:
            async for event in source:
                yield event
        except EngineError:
            raise
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise EngineProtocolError(f"engine reply could not be read: {describe(exc)}") from exc
        finally:
            await source.aclose()

    return wrapper
