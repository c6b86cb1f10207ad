"""A client of the rollout server's API (what ``polar submit`` / ``polar status``
and a trainer use)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx

from polar.rollout.protocol import (
    EventKind,
    GatewayAccess,
    TaskResult,
    TaskSubmission,
    TaskView,
)


class RolloutError(Exception):
    """The server refused a call; the message is its one-line reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Abandoned(Exception):
    """A wait given up by its caller (:meth:`RolloutClient.wait`'s ``abandon``)."""


class RolloutClient:
    def __init__(self, url: str, *, token: str | None = None, timeout_s: float = 30.0) -> None:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RolloutClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            reply = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise RolloutError(0, f"rollout server unreachable: {exc}") from None
        if reply.status_code >= 400:
            self._raise(reply)
        return reply

    def submit(self, submission: TaskSubmission) -> TaskView:
        reply = self._call("POST", "/tasks", content=submission.model_dump_json())
        return TaskView.model_validate_json(reply.content)

    def task(self, task_id: str) -> TaskView:
        return TaskView.model_validate_json(self._call("GET", f"/tasks/{task_id}").content)

    def tasks(self, status: str | None = None) -> list[TaskView]:
        params = {"status": status} if status else {}
        reply = self._call("GET", "/tasks", params=params)
        return [TaskView.model_validate(view) for view in reply.json()]

    def cancel(self, task_id: str) -> TaskView:
        return TaskView.model_validate_json(self._call("POST", f"/tasks/{task_id}/cancel").content)

    def result(self, task_id: str, *, wait_s: float = 0.0) -> TaskResult | TaskView:
        """The result once the task finished; its current view otherwise."""
        reply = self._call(
            "GET", f"/tasks/{task_id}/result", params={"wait": wait_s}, timeout=wait_s + 30
        )
        if reply.status_code == 202:
            return TaskView.model_validate_json(reply.content)
        return TaskResult.model_validate_json(reply.content)

    def wait(
        self,
        task_id: str,
        timeout_s: float,
        *,
        abandon: threading.Event | None = None,
        poll_s: float = 60.0,
    ) -> TaskResult:
        """The task's result, asking the server every ``poll_s`` at most (a long
        poll); :class:`TimeoutError` after ``timeout_s``, :class:`Abandoned` once
        ``abandon`` is set (checked between polls)."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            outcome = self.result(task_id, wait_s=max(0.0, min(poll_s, left)))
            if isinstance(outcome, TaskResult):
                return outcome
            if left <= 0:
                raise TimeoutError(f"task {task_id} still {outcome.status.value}")
            if abandon is not None and abandon.is_set():
                raise Abandoned(f"stopped waiting for task {task_id} ({outcome.status.value})")

    def nodes(self) -> list[dict[str, Any]]:
        nodes: list[dict[str, Any]] = self._call("GET", "/nodes").json()
        return nodes

    def gateways(self) -> list[GatewayAccess]:
        """The nodes' gateways and their admin tokens (what weight sync needs)."""
        reply = self._call("GET", "/gateways")
        return [GatewayAccess.model_validate(g) for g in reply.json()]

    def events(self, task_id: str | None = None) -> Iterator[tuple[EventKind, dict[str, Any]]]:
        """Server-sent events as ``(kind, data)``; a task's stream ends when it finishes.

        Events of a kind this client does not know (from a newer server) are skipped."""
        path = f"/tasks/{task_id}/events" if task_id else "/events"
        try:
            with self._http.stream("GET", path, timeout=httpx.Timeout(30, read=None)) as reply:
                if reply.status_code >= 400:
                    reply.read()
                    self._raise(reply)
                kind: EventKind | None = None
                for line in reply.iter_lines():
                    if line.startswith("event:"):
                        with contextlib.suppress(ValueError):
                            kind = EventKind(line[6:].strip())
                    elif line.startswith("data:"):
                        if kind is not None:
                            yield kind, json.loads(line[5:])
                        kind = None
        except httpx.HTTPError as exc:
            raise RolloutError(0, f"rollout server unreachable: {exc}") from None

    @staticmethod
    def _raise(reply: httpx.Response) -> None:
        try:
            message = reply.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = f"HTTP {reply.status_code}"
        raise RolloutError(reply.status_code, message)
