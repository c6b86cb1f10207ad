"""The per-session barrier a trajectory build waits on (:class:`CallTracker`)."""

from __future__ import annotations

import asyncio

import pytest

from polar.proxy.control.sessions import CallTracker


def test_settle_waits_for_calls_then_cuts_off_what_outlives_the_grace() -> None:
    async def go() -> None:
        calls = CallTracker()
        finished: list[str] = []

        async def call(name: str, seconds: float, session: str = "s1") -> None:
            with calls.track(session):
                try:
                    await asyncio.sleep(seconds)
                    finished.append(name)
                except asyncio.CancelledError:
                    assert calls.was_cut(asyncio.current_task())
                    finished.append(f"{name} cut")
                    raise

        quick = asyncio.create_task(call("quick", 0.05))
        await asyncio.sleep(0)
        assert calls.in_flight("s1") == 1
        assert await calls.settle("s1", grace_s=5.0, timeout_s=1.0) == 0
        assert finished == ["quick"] and quick.done()

        hung = asyncio.create_task(call("hung", 3600))
        other = asyncio.create_task(call("other session", 0.01, "s2"))
        await asyncio.sleep(0)
        assert await calls.settle("s1", grace_s=0.05, timeout_s=1.0) == 1
        with pytest.raises(asyncio.CancelledError):
            await hung
        await other
        assert sorted(finished) == ["hung cut", "other session", "quick"]
        assert calls.in_flight("s1") == 0
        assert await calls.settle("nobody", grace_s=0.0, timeout_s=0.0) == 0

    asyncio.run(go())
