"""CPU-heavy steps off the event loop, bounded in number and in bytes.

One event loop serves every session's stream; a step that holds it for
seconds (rendering and tokenizing a 4 MB prompt, parsing a 30 MB body) stalls
every stream at once. Such steps run here instead, on worker threads: at most
``workers`` at a time, and at most ``budget_bytes`` of input being worked on
at once (a step bigger than the whole budget runs alone), so memory stays
bounded whatever arrives. Waiting steps go first come, first served.

Steps of at most ``small_bytes`` (an ordinary agent's call) have a lane of
their own, outside the budget, so they never queue behind big ones: a few
4 MB prompts being rendered do not hold up every other session's next call.
Steps of at most ``inline_bytes`` (a short conversation, a small body) run
on the loop itself: a hop to a thread and back costs more CPU than they do
(measured with ``benchmarks/gateway.py --scale``), and they hold the loop for
well under a millisecond.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
from collections import deque
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Offload:
    def __init__(
        self,
        *,
        workers: int,
        budget_bytes: int,
        small_bytes: int = 256 << 10,
        inline_bytes: int = 8 << 10,
    ) -> None:
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="polar-offload"
        )
        self._small_executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="polar-offload-small"
        )
        self._small = small_bytes
        self._inline = inline_bytes
        self._budget = budget_bytes
        self._used = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    @property
    def used_bytes(self) -> int:
        return self._used

    async def run(self, cost: int, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` on a worker thread, once ``cost`` bytes of budget are free
        (a step of at most ``inline_bytes``: here, at once).

        The budget is given back when the step ends, not when its caller stops
        waiting (a cancelled caller does not stop a running thread).
        """
        cost = max(0, cost)
        if cost <= self._inline:
            return fn(*args)
        if cost <= self._small:
            small = self._small_executor.submit(functools.partial(fn, *args))
            return await asyncio.wrap_future(small)
        await self._acquire(cost)
        loop = asyncio.get_running_loop()
        try:
            future = self._executor.submit(functools.partial(fn, *args))
        except BaseException:
            self._release(cost)
            raise
        future.add_done_callback(functools.partial(_call_soon, loop, self._release, cost))
        return await asyncio.wrap_future(future)

    async def _acquire(self, cost: int) -> None:
        if not self._waiters and self._fits(cost):
            self._used += cost
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (cost, waiter)
        self._waiters.append(entry)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release(cost)  # granted just as the caller went away
            else:
                with contextlib.suppress(ValueError):  # already dropped by _release
                    self._waiters.remove(entry)
            raise

    def _fits(self, cost: int) -> bool:
        return self._used == 0 or self._used + cost <= self._budget

    def _release(self, cost: int) -> None:
        self._used -= cost
        while self._waiters:
            cost, waiter = self._waiters[0]
            if waiter.done():
                self._waiters.popleft()
                continue
            if not self._fits(cost):
                return
            self._waiters.popleft()
            self._used += cost
            waiter.set_result(None)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._small_executor.shutdown(wait=False, cancel_futures=True)


def _call_soon(
    loop: asyncio.AbstractEventLoop, fn: Callable[[int], None], cost: int, _: object
) -> None:
    with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to give back to
        loop.call_soon_threadsafe(fn, cost)
