"""What the router answers itself: the admin API and ``/health`` across workers.

A session's own endpoints (``/admin/sessions/{id}...``) go to the worker that
owns it; creating a session goes to the worker that will own it (the router
names a session created without an id, so it knows which one); the rest is
asked of every worker and the answers merged: the session list, status, pause
(each worker drains its own calls; the group is drained when all are) and
resume (each worker persists and stamps the same policy version). Every reply
has the shape a lone gateway gives, plus a ``workers`` list where merged.
Errors a worker gives (a bad admin token, a bad body) are passed on as they are.
"""

from __future__ import annotations

import asyncio
import hmac
import secrets
from typing import Any
from urllib.parse import unquote

import httpx
import orjson

from polar.proxy.control.sessions import hash_key
from polar.proxy.errors import ProxyError
from polar.proxy.front.inbound import api_key_of, bearer_of
from polar.proxy.workers.affinity import owner_of
from polar.proxy.workers.router import RouteTable, WorkerLink
from polar.proxy.workers.wire import Head, response

_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "te", "upgrade"}
)
_SUMMED = ("inflight", "waiting", "open_sessions")

Reply = tuple[int, str, bytes]
"""Status, content type, body."""


class Fanout:
    def __init__(self, links: list[WorkerLink], table: RouteTable, *, admin_token: str) -> None:
        self.links = links
        self.table = table
        self.paused = False
        """The group was paused (and not resumed since): a restarted worker is paused too."""
        self.body_limit = 2 << 20
        self._token = admin_token.encode()
        self._clients = [
            httpx.AsyncClient(
                transport=httpx.AsyncHTTPTransport(uds=link.socket_path),
                base_url="http://worker",
                timeout=None,
            )
            for link in links
        ]

    async def aclose(self) -> None:
        for client in self._clients:
            await client.aclose()

    async def answer(self, head: Head, body: bytes) -> bytes:
        status, content_type, data = await self._answer(head, body)
        if head.method == "HEAD":
            data = b""
        return response(status, data, content_type=content_type, close=not head.keep_alive)

    async def _answer(self, head: Head, body: bytes) -> Reply:
        path, method = head.path, head.method
        headers = {k: v for k, v in head.headers.items() if k not in _HOP}
        try:
            # The headers reach a worker as a mapping: a repeated key is refused here.
            admin = hmac.compare_digest((bearer_of(head.fields) or "").encode(), self._token)
            key = api_key_of(head.fields)
        except ProxyError as error:
            body = orjson.dumps({"error": {"message": error.message, "type": error.code}})
            return error.status, "application/json", body
        if path == "/health" and method == "GET":
            return await self._health(head, headers)
        if path == "/admin/sessions" and method == "POST" and admin:
            return await self._create(head, headers, body)
        if path.startswith("/admin/sessions/"):
            owner = owner_of(unquote(path.split("/")[3]), self.table.workers)
            reply = await self.ask(owner, head, headers, body)
            if method == "DELETE" and reply[0] == 204 and len(path.split("/")) == 4:
                self.table.drop(unquote(path.split("/")[3]))
            return reply
        if admin and (method, path) in _FANNED:
            return await self._fan(head, headers, body)
        return await self.ask(self.table.route(key), head, headers, body)

    async def ask(self, index: int, head: Head, headers: dict[str, str], body: bytes) -> Reply:
        """One worker's answer to the request (503 if it is down)."""
        link = self.links[index]
        if not link.up:
            return _down(index)
        try:
            got = await self._clients[index].request(
                head.method, head.target, headers=headers, content=body
            )
        except httpx.HTTPError:
            return _down(index)
        return got.status_code, got.headers.get("content-type", "application/json"), got.content

    async def _create(self, head: Head, headers: dict[str, str], body: bytes) -> Reply:
        try:
            spec = orjson.loads(body) if body else {}
        except orjson.JSONDecodeError:
            spec = None
        owner = 0
        if isinstance(spec, dict):
            sid = spec.get("session_id")
            if sid is None:
                # Named here, so the router knows which worker will own it.
                sid = spec["session_id"] = f"ses_{secrets.token_hex(12)}"
                body = orjson.dumps(spec)
                headers = {**headers, "content-type": "application/json"}
            if isinstance(sid, str):
                owner = owner_of(sid, self.table.workers)
        status, content_type, data = await self.ask(owner, head, headers, body)
        if status == 201:
            created = orjson.loads(data)
            self.table.add(created["session_id"], hash_key(created["api_key"]))
        return status, content_type, data

    async def _fan(self, head: Head, headers: dict[str, str], body: bytes) -> Reply:
        if head.path == "/admin/pause":
            self.paused = True
        replies = await asyncio.gather(
            *(self.ask(i, head, headers, body) for i in range(len(self.links)))
        )
        worst = next((r for r in replies if r[0] not in (200, 504)), None)
        if worst is not None:
            return worst
        bodies = [orjson.loads(r[2]) for r in replies]
        status = 504 if any(r[0] == 504 for r in replies) else 200
        if head.path == "/admin/resume":
            self.paused = False
        if head.path == "/admin/sessions":
            sessions = sorted(
                (s for b in bodies for s in b["sessions"]), key=lambda s: s["created_at"]
            )
            return 200, "application/json", orjson.dumps({"sessions": sessions})
        return status, "application/json", orjson.dumps(_merge_status(bodies))

    async def _health(self, head: Head, headers: dict[str, str]) -> Reply:
        replies = await asyncio.gather(
            *(self.ask(i, head, headers, b"") for i in range(len(self.links)))
        )
        workers: list[dict[str, Any]] = []
        for index, (status, _, data) in enumerate(replies):
            try:
                detail = orjson.loads(data)
            except orjson.JSONDecodeError:
                detail = {}
            detail = detail if isinstance(detail, dict) else {}
            if status >= 500 and "store" not in detail:
                detail = {"status": "down", "worker": index}
            workers.append(detail)
        healthy = all(r[0] == 200 for r in replies)
        body = {"status": "ok" if healthy else "degraded", "workers": workers}
        return (200 if healthy else 503), "application/json", orjson.dumps(body)


_FANNED = frozenset(
    {
        ("GET", "/admin/sessions"),
        ("POST", "/admin/pause"),
        ("POST", "/admin/resume"),
        ("GET", "/admin/status"),
    }
)


def _merge_status(bodies: list[dict[str, Any]]) -> dict[str, Any]:
    """One gateway's status from its workers': counts summed, paused if any is,
    drained when all are, the policy version they share (the highest if not)."""
    merged = dict(bodies[0])
    merged["paused"] = any(b["paused"] for b in bodies)
    for name in _SUMMED:
        merged[name] = sum(b[name] for b in bodies)
    merged["policy_version"] = max(b["policy_version"] for b in bodies)
    if "drained" in merged:
        merged["drained"] = all(b["drained"] for b in bodies)
        merged["drained_calls"] = sum(b["drained_calls"] for b in bodies)
        merged["waited_s"] = max(b["waited_s"] for b in bodies)
    merged["workers"] = [
        {
            "worker": i,
            "paused": b["paused"],
            "inflight": b["inflight"],
            "waiting": b["waiting"],
            "policy_version": b["policy_version"],
            "open_sessions": b["open_sessions"],
        }
        for i, b in enumerate(bodies)
    ]
    return merged


def _down(index: int) -> Reply:
    message = f"gateway worker {index} is not running (it is being restarted)"
    body = orjson.dumps({"error": {"message": message, "type": "worker_unavailable"}})
    return 503, "application/json", body
