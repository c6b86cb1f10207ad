"""CPU-heavy steps off the event loop: bounded in bytes, small steps never queued behind big."""

from __future__ import annotations

import asyncio
import threading
import time

from polar.proxy.call.offload import Offload


def test_big_steps_share_the_budget_and_small_ones_pass_them() -> None:
    async def go() -> list[str]:
        offload = Offload(workers=2, budget_bytes=4 << 20)
        order: list[str] = []
        running = threading.Semaphore(0)

        def step(name: str, seconds: float) -> str:
            running.release()
            time.sleep(seconds)
            order.append(name)
            return name

        # Two 3 MB steps do not fit the 4 MB budget together: the second waits.
        first = asyncio.create_task(offload.run(3 << 20, step, "big 1", 0.3))
        second = asyncio.create_task(offload.run(3 << 20, step, "big 2", 0.0))
        await asyncio.sleep(0.05)
        assert offload.used_bytes == 3 << 20
        # A small step has its own lane: done while big 1 still runs.
        assert await offload.run(100_000, step, "small", 0.0) == "small"
        await asyncio.gather(first, second)
        await asyncio.sleep(0.01)  # the budget comes back on the loop
        assert offload.used_bytes == 0
        offload.close()
        return order

    assert asyncio.run(go()) == ["small", "big 1", "big 2"]


def test_the_event_loop_keeps_ticking_while_a_big_step_runs() -> None:
    async def go() -> float:
        offload = Offload(workers=1, budget_bytes=1 << 20)
        work = asyncio.create_task(offload.run(8 << 20, time.sleep, 1.0))
        worst, last = 0.0, time.perf_counter()
        while not work.done():
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            worst, last = max(worst, now - last), now
        offload.close()
        return worst

    # Blocked, the loop would miss one whole second; it misses far less.
    assert asyncio.run(go()) < 0.5


def test_a_tiny_step_runs_on_the_loop_and_a_small_one_on_a_worker() -> None:
    async def go() -> tuple[str, str, str]:
        offload = Offload(workers=1, budget_bytes=1 << 20, inline_bytes=8 << 10)
        name = threading.current_thread
        tiny = await offload.run(8 << 10, lambda: name().name)
        small = await offload.run((8 << 10) + 1, lambda: name().name)
        offload.close()
        return name().name, tiny, small

    here, tiny, small = asyncio.run(go())
    assert tiny == here
    assert small != here and small.startswith("polar-offload-small")
