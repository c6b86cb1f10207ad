"""Take the next item of an async iterator now if it is ready, else say so.

Streamed replies write what is ready together: the engine's events often
arrive several to a network read (vLLM under load sends a burst of deltas at
once), and one socket write per delta made syscalls a large share of a
streamed reply's CPU. :func:`poll_next` starts ``anext`` and runs it as far as
it goes without waiting; the caller writes what it holds only when the next
event is not there yet, then awaits it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Coroutine, Generator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Pending(Generic[T]):
    """The rest of an ``anext`` that had to wait: await it (once) for the item."""

    __slots__ = ("_coro", "_first")

    def __init__(self, coro: Coroutine[Any, Any, T], first: Any) -> None:
        self._coro = coro
        self._first = first

    def __await__(self) -> Generator[Any, Any, T]:
        # What ``yield from coro`` does, from the point where it first suspended:
        # every future it waits on goes to the task, and what the task sends
        # (or throws: cancellation) goes back into it.
        coro, value = self._coro, self._first
        while True:
            try:
                sent = yield value
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:
                try:
                    value = coro.throw(exc)
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]
            else:
                try:
                    value = coro.send(sent)
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]

    def close(self) -> None:
        """Abandon the wait (never awaited): the ``anext`` is closed."""
        self._coro.close()


def poll_next(iterator: AsyncIterator[T]) -> T | Pending[T]:
    """The next item when it is there without waiting, else a :class:`Pending`
    to await for it; raises what ``anext`` raises (``StopAsyncIteration`` at
    the end). (An iterator of ``Pending`` objects cannot use this.)"""
    coro = iterator.__anext__()
    try:
        first = coro.send(None)  # type: ignore[attr-defined]
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    return Pending(coro, first)  # type: ignore[arg-type]
