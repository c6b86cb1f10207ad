"""The rollout server's event stream: every status change, fanned out to SSE
subscribers. Slow subscribers are cut off (with a last ``overflow`` event)
rather than slowing the server or growing its memory."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from polar.rollout.protocol import EventKind

QUEUE_LIMIT = 1000
KEEPALIVE_S = 15.0


@dataclass(frozen=True, slots=True)
class Event:
    kind: EventKind
    data: dict[str, Any]
    at: float = field(default_factory=time.time)

    @property
    def task_id(self) -> str | None:
        value = self.data.get("task_id")
        return value if isinstance(value, str) else None

    def sse(self) -> bytes:
        body = json.dumps({"at": round(self.at, 3), **self.data}, separators=(",", ":"))
        return f"event: {self.kind.value}\ndata: {body}\n\n".encode()


class Subscriber:
    def __init__(self, task_id: str | None) -> None:
        self.task_id = task_id
        self.queue: asyncio.Queue[Event | None] = asyncio.Queue(QUEUE_LIMIT)
        self.overflowed = False


class EventHub:
    def __init__(self) -> None:
        self._subscribers: set[Subscriber] = set()

    def publish(self, kind: EventKind, **data: Any) -> None:
        event = Event(kind, data)
        for sub in list(self._subscribers):
            if sub.task_id is not None and event.task_id != sub.task_id:
                continue
            try:
                sub.queue.put_nowait(event)
            except asyncio.QueueFull:
                sub.overflowed = True
                self._subscribers.discard(sub)
                sub.queue.get_nowait()  # room for the closing marker
                sub.queue.put_nowait(None)

    def close(self) -> None:
        for sub in list(self._subscribers):
            self._subscribers.discard(sub)
            if sub.queue.full():
                sub.queue.get_nowait()
            sub.queue.put_nowait(None)

    async def stream(self, task_id: str | None, *, until_finished: bool) -> AsyncIterator[bytes]:
        """SSE bytes for one subscriber; ends after ``task.finished`` when asked."""
        sub = Subscriber(task_id)
        self._subscribers.add(sub)
        try:
            yield b": polar rollout events\n\n"
            while True:
                try:
                    event = await asyncio.wait_for(sub.queue.get(), KEEPALIVE_S)
                except TimeoutError:
                    yield b": keep-alive\n\n"
                    continue
                if event is None:
                    if sub.overflowed:
                        yield Event(EventKind.OVERFLOW, {"message": "subscriber too slow"}).sse()
                    return
                yield event.sse()
                if until_finished and event.kind is EventKind.TASK_FINISHED:
                    return
        finally:
            self._subscribers.discard(sub)
