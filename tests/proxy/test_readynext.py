"""Taking the next event at once when it is there (what lets a streamed reply
write deltas that arrived together in one write)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from polar.proxy.call.readynext import Pending, poll_next


async def _burst_then_wait(gate: asyncio.Event) -> AsyncGenerator[int, None]:
    yield 1
    yield 2  # arrived with 1: no wait between them
    await gate.wait()
    yield 3


def test_ready_items_come_at_once_and_a_wait_is_handed_back() -> None:
    async def go() -> None:
        gate = asyncio.Event()
        events = _burst_then_wait(gate)
        assert poll_next(events) == 1
        assert poll_next(events) == 2
        got = poll_next(events)
        assert isinstance(got, Pending)
        asyncio.get_running_loop().call_later(0.01, gate.set)
        assert await got == 3
        with pytest.raises(StopAsyncIteration):
            poll_next(events)

    asyncio.run(go())


def test_cancelling_a_pending_wait_reaches_the_iterator() -> None:
    cleaned: list[str] = []

    async def forever() -> AsyncGenerator[int, None]:
        try:
            await asyncio.sleep(3600)
            yield 0
        except asyncio.CancelledError:
            cleaned.append("cancelled")
            raise

    async def go() -> None:
        events = forever()
        got = poll_next(events)
        assert isinstance(got, Pending)

        async def wait() -> int:
            return await got

        task = asyncio.create_task(wait())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert cleaned == ["cancelled"]

    asyncio.run(go())


def test_an_error_surfaces_where_the_item_would() -> None:
    async def failing(wait: bool) -> AsyncGenerator[int, None]:
        if wait:
            await asyncio.sleep(0.001)
        raise RuntimeError("engine went away")
        yield 0

    async def go() -> None:
        with pytest.raises(RuntimeError, match="went away"):
            poll_next(failing(False))
        got = poll_next(failing(True))
        assert isinstance(got, Pending)
        with pytest.raises(RuntimeError, match="went away"):
            await got

    asyncio.run(go())
