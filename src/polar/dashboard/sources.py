"""Where the dashboard's data comes from: the rollout server's API, the gateway
record stores, the trainer's metrics log and an SFT generation's statistics.

Everything here reads; the one write is :meth:`RolloutSource.cancel`. Ids are
checked against the rollout service's id pattern before they go anywhere, so
a path never carries anything but an id. A source that cannot answer raises
:class:`SourceError` with one line the page shows as it is.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from polar.dashboard.errors import DashboardError
from polar.ir import CompletionRecord
from polar.proxy.store import SessionRow, SqliteStore, StoreError
from polar.rollout.protocol import ID_PATTERN, TaskResult, TaskStatus, TaskView

_ID = re.compile(ID_PATTERN)
M = TypeVar("M", bound=BaseModel)
MAX_LOG_BYTES = 64 << 20
"""A metrics log or statistics file larger than this is not read."""


class SourceError(DashboardError):
    """A source could not answer; ``status`` is what the dashboard answers with."""


def valid_id(value: str) -> bool:
    return _ID.fullmatch(value) is not None


class RolloutSource:
    """The rollout server's API under the control token."""

    def __init__(self, url: str, token: str, *, timeout_s: float) -> None:
        self.url = url.rstrip("/")
        self._client = httpx.AsyncClient(
            base_url=self.url,
            headers={"authorization": f"Bearer {token}"},
            timeout=timeout_s,
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _get(self, path: str, **params: str) -> httpx.Response:
        try:
            reply = await self._client.get(path, params=params)
        except httpx.HTTPError as exc:
            raise SourceError(
                502, f"the rollout server at {self.url} did not answer ({exc})"
            ) from None
        return reply

    def _raise(self, reply: httpx.Response) -> None:
        if reply.status_code >= 400:
            try:
                message = reply.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = reply.text[:200]
            status = 404 if reply.status_code == 404 else 502
            raise SourceError(status, f"rollout server: {reply.status_code} {message}")

    async def tasks(self, status: TaskStatus | None = None) -> list[TaskView]:
        reply = await self._get("/tasks", **({"status": status.value} if status else {}))
        self._raise(reply)
        try:
            return [TaskView.model_validate(item) for item in reply.json()]
        except (ValueError, ValidationError) as exc:
            raise SourceError(502, f"rollout server: unexpected task list ({exc})") from None

    async def task(self, task_id: str) -> TaskView | None:
        if not valid_id(task_id):
            return None
        reply = await self._get(f"/tasks/{task_id}")
        if reply.status_code == 404:
            return None
        self._raise(reply)
        return _parse(TaskView, reply)

    async def result(self, task_id: str) -> TaskResult | None:
        """The finished task's result (None while it runs, or if unknown)."""
        if not valid_id(task_id):
            return None
        reply = await self._get(f"/tasks/{task_id}/result")
        if reply.status_code in (202, 404):
            return None
        self._raise(reply)
        return _parse(TaskResult, reply)

    async def cancel(self, task_id: str) -> TaskView:
        if not valid_id(task_id):
            raise SourceError(404, f"no task {task_id}")
        try:
            reply = await self._client.post(f"/tasks/{task_id}/cancel")
        except httpx.HTTPError as exc:
            raise SourceError(
                502, f"the rollout server at {self.url} did not answer ({exc})"
            ) from None
        self._raise(reply)
        return _parse(TaskView, reply)

    async def events(self) -> AsyncIterator[bytes]:
        """The server's event stream (SSE bytes as sent), until either side closes."""
        try:
            async with self._client.stream(
                "GET", "/events", timeout=httpx.Timeout(10.0, read=None)
            ) as reply:
                if reply.status_code != 200:
                    await reply.aread()
                    self._raise(reply)
                async for chunk in reply.aiter_raw():
                    yield chunk
        except httpx.HTTPError as exc:
            raise SourceError(502, f"the rollout server's event stream broke ({exc})") from None


def _parse(model: type[M], reply: httpx.Response) -> M:
    try:
        return model.model_validate_json(reply.content)
    except ValidationError as exc:
        raise SourceError(502, f"rollout server: unexpected answer ({exc})") from None


def task_of_session(session_id: str) -> str | None:
    """The rollout task a session belongs to (sessions are ``<task_id>-s<i>``)."""
    task_id, sep, index = session_id.rpartition("-s")
    return task_id if sep and index.isdigit() and valid_id(task_id) else None


@dataclass(frozen=True, slots=True)
class StoredSession:
    store: SqliteStore
    row: SessionRow


class RecordSource:
    """Gateway record stores, read through read-only connections (a gateway may
    be writing them)."""

    def __init__(self, paths: tuple[Path, ...]) -> None:
        self.stores = tuple(SqliteStore(path) for path in paths)

    def find(self, session_id: str) -> StoredSession | None:
        if not valid_id(session_id):
            return None
        for store in self.stores:
            try:
                row = store.session(session_id)
            except StoreError as exc:
                raise SourceError(503, str(exc)) from None
            if row is not None:
                return StoredSession(store, row)
        return None

    def sessions(self) -> list[StoredSession]:
        found: list[StoredSession] = []
        for store in self.stores:
            try:
                rows = store.load_sessions(include_closed=True)
            except StoreError as exc:
                raise SourceError(503, str(exc)) from None
            found.extend(StoredSession(store, row) for row in rows)
        return found

    def records(self, stored: StoredSession) -> list[CompletionRecord]:
        try:
            return stored.store.records(stored.row.id)
        except (StoreError, ValueError) as exc:
            raise SourceError(503, f"{stored.store.path}: cannot read records ({exc})") from None


@dataclass(frozen=True, slots=True)
class TrainingLog:
    """The trainer's JSONL log: one row per step (``step``, ``policy_version``,
    ``time`` and the step's metrics); lines that are not such rows are counted."""

    path: Path
    rows: tuple[dict[str, float], ...]
    unreadable: int

    def series(self, name: str) -> list[tuple[float, float]]:
        return [
            (row["step"], row[name])
            for row in self.rows
            if name in row and math.isfinite(row[name])
        ]


def _bounded_bytes(path: Path, what: str) -> bytes:
    try:
        size = path.stat().st_size
        if size > MAX_LOG_BYTES:
            raise SourceError(500, f"{path}: {what} is {size} bytes, more than the dashboard reads")
        return path.read_bytes()
    except OSError as exc:
        raise SourceError(500, f"{path}: cannot read {what} ({exc.strerror})") from None


def read_metrics(path: Path) -> TrainingLog | None:
    """The log at ``path`` (or ``path/metrics.jsonl``); None when there is none yet."""
    file = path / "metrics.jsonl" if path.is_dir() else path
    if not file.exists():
        return None
    rows: list[dict[str, float]] = []
    unreadable = 0
    for line in _bounded_bytes(file, "the metrics log").splitlines():
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError):
            unreadable += 1
            continue
        if not isinstance(data, dict) or not isinstance(data.get("step"), int):
            unreadable += 1
            continue
        rows.append(
            {
                k: float(v)
                for k, v in data.items()
                if isinstance(v, int | float) and not isinstance(v, bool)
            }
        )
    return TrainingLog(file, tuple(rows), unreadable)


def read_sft_stats(path: Path) -> dict[str, Any] | None:
    """An SFT generation's ``stats.json`` (version 1; see :mod:`polar.sft.stats`),
    or None when there is none yet."""
    file = path / "stats.json" if path.is_dir() else path
    if not file.exists():
        return None
    try:
        data = json.loads(_bounded_bytes(file, "the SFT statistics"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise SourceError(500, f"{file}: not JSON") from None
    if not isinstance(data, dict) or data.get("version") != 1:
        raise SourceError(500, f"{file}: not SFT statistics of version 1")
    if not isinstance(data.get("overall"), dict) or not isinstance(data.get("tasks"), list):
        raise SourceError(500, f"{file}: SFT statistics without 'overall' and 'tasks'")
    return data
