"""How a scripted engine streams: a delay before each token, a crash after some."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass


class ScriptedCrash(Exception):
    """Raised inside a streaming reply: the server drops the connection mid-stream."""


@dataclass(frozen=True, slots=True)
class Pacing:
    """``delay_s`` before each streamed token; ``crash_after``: drop the connection
    when that many tokens are out (a turn's ``crash_after``)."""

    delay_s: float = 0.0
    crash_after: int | None = None

    async def pause(self) -> None:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)

    async def tokens(self, count: int) -> AsyncIterator[int]:
        """The positions ``0..count-1``, paced; raises :class:`ScriptedCrash` where scripted."""
        for i in range(count):
            if i == self.crash_after:
                raise ScriptedCrash(f"scripted crash after {i} tokens")
            await self.pause()
            yield i
