"""The rollout server's side of task callbacks: a finished task's result POSTed to
the submission's ``callback_url``.

Signed, never with a token (:mod:`polar.rollout.callbacks`: under the
submission's ``callback_secret``, else the control token). ``callback_attempts``
tries, the waits between them doubling from one second. The outcome is stored
on the task (``callback_done``, and ``callback_error`` once every try failed), so
a restarted server re-sends only the callbacks it still owes; the result stays
pollable either way.
"""

from __future__ import annotations

import asyncio
import logging

import httpx

from polar.rollout.callbacks import signed_headers
from polar.rollout.config import ServerConfig
from polar.rollout.server.store import RolloutStore

_log = logging.getLogger(__name__)


class CallbackDelivery:
    def __init__(self, config: ServerConfig, store: RolloutStore) -> None:
        self._config = config
        self._store = store
        self._http: httpx.AsyncClient | None = None
        """For callback URLs: carries no credential."""

    def open(self) -> None:
        self._http = httpx.AsyncClient(timeout=30)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()

    async def deliver(self, task_id: str) -> None:
        """POST the task's result to its callback URL, signed, without a token."""
        task = self._store.task(task_id)
        result = self._store.result(task_id)
        url = task.submission.callback_url if task is not None else None
        if task is None or result is None or url is None or self._http is None:
            return
        body = result.model_dump_json().encode()
        secret = task.submission.callback_secret or self._config.control_token
        attempts = self._config.callback_attempts
        wait, error = 1.0, None
        for attempt in range(1, attempts + 1):
            try:
                reply = await self._http.post(
                    url, content=body, headers=signed_headers(body, secret)
                )
                if reply.status_code < 300:
                    self._store.update_task(task_id, callback_done=1, callback_error=None)
                    return
                error = f"HTTP {reply.status_code}: {reply.text[:200]}"
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"
            _log.warning("callback for %s failed (attempt %d): %s", task_id, attempt, error)
            if attempt < attempts:
                await asyncio.sleep(wait)
                wait *= 2
        self._store.update_task(
            task_id,
            callback_done=1,
            callback_error=f"{attempts} attempts failed; last: {error}",
        )
