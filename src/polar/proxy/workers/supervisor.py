"""The parent of a gateway group: the store's owner, the workers' keeper, the router.

Start-up: open the record store (schema, migrations, the single-group lock,
calls an earlier run left in flight marked ``interrupted``), start the N
workers (each writes the same store, serving the sessions it owns), and only
once all of them answer, listen on the public address. A worker that fails
during start-up stops the group with its exit status.

A worker that dies later does not stop the others: the router answers its
sessions' calls with 503 (in the dialect's shape) while the parent marks its
calls in flight ``interrupted``, starts it again (after 1 s, doubling up to
30 s while it keeps dying) and, if the group is paused, pauses it before it
serves. Its sessions then go on (keys, sequence numbers and the policy version
come from the store); only their transcripts are gone, so the next call of each
is rendered afresh (lineage ``fresh``/``diverged`` once, as after a restart).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable

import httpx

from polar.proxy.config import GatewayConfig
from polar.proxy.store import SqliteStore
from polar.proxy.workers.affinity import WorkerSlot
from polar.proxy.workers.fanout import Fanout
from polar.proxy.workers.router import Router, RouteTable, WorkerLink

_log = logging.getLogger(__name__)

WORKER_MODULE = "polar.cli.gateway_worker"
START_TIMEOUT_S = 300.0


class GroupError(Exception):
    """The group could not start (one line)."""


class Group:
    def __init__(self, settings: GatewayConfig) -> None:
        self.settings = settings
        self._dir = tempfile.mkdtemp(prefix="polar-gateway-")
        os.chmod(self._dir, 0o700)
        count = settings.workers
        self.links = [WorkerLink(i, os.path.join(self._dir, f"w{i}.sock")) for i in range(count)]
        self.table = RouteTable(count)
        self.fanout = Fanout(self.links, self.table, admin_token=settings.admin_token)
        self.router = Router(
            self.links, self.table, fanout=self.fanout, idle_s=settings.keepalive_s
        )
        self.store = SqliteStore(
            settings.store.path,
            synchronous=settings.store.synchronous,
            write_timeout_s=settings.store.write_timeout_s,
        )
        self._procs: list[asyncio.subprocess.Process | None] = [None] * count
        self._stopping = False
        self._stop = asyncio.Event()

    async def run(
        self, stop: asyncio.Event, *, on_ready: Callable[[], None] = lambda: None
    ) -> None:
        self._stop = stop
        self.store.open()
        try:
            for row in self.store.load_sessions():
                self.table.add(row.id, row.key_hash)
            await self._start_all()
            sock = socket.create_server(
                (self.settings.host, self.settings.port), backlog=2048, reuse_port=False
            )
            server = await asyncio.start_server(self.router.serve, sock=sock, limit=1 << 16)
            keepers = [asyncio.ensure_future(self._keep(link)) for link in self.links]
            _log.info(
                "gateway: %d workers behind http://%s:%d",
                len(self.links),
                self.settings.host,
                self.settings.port,
            )
            on_ready()
            try:
                await stop.wait()
            finally:
                self._stopping = True
                server.close()
                for keeper in keepers:
                    keeper.cancel()
        finally:
            self._stopping = True
            await self._stop_all()
            await self.fanout.aclose()
            self.store.close()
            shutil.rmtree(self._dir, ignore_errors=True)

    async def _start_all(self) -> None:
        starts = [asyncio.ensure_future(self._start(link)) for link in self.links]
        try:
            await asyncio.gather(*starts)
        except BaseException:
            for start in starts:
                start.cancel()
            raise

    async def _start(self, link: WorkerLink) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(link.socket_path)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            WORKER_MODULE,
            str(link.index),
            str(len(self.links)),
            link.socket_path,
            stdin=asyncio.subprocess.PIPE,
        )
        self._procs[link.index] = proc
        assert proc.stdin is not None
        proc.stdin.write(self.settings.model_dump_json().encode())
        await proc.stdin.drain()
        proc.stdin.close()
        link.pid = proc.pid
        deadline = time.monotonic() + START_TIMEOUT_S
        async with httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=link.socket_path), timeout=5.0
        ) as client:
            while True:
                if proc.returncode is not None:
                    raise GroupError(
                        f"gateway worker {link.index} exited with status {proc.returncode} "
                        "while starting"
                    )
                if time.monotonic() > deadline:
                    raise GroupError(f"gateway worker {link.index} did not start in time")
                try:
                    await client.get("http://worker/health")
                    break
                except httpx.HTTPError:
                    await asyncio.sleep(0.05)
            if self.fanout.paused:
                await client.post(
                    "http://worker/admin/pause",
                    headers={"authorization": f"Bearer {self.settings.admin_token}"},
                    json={"timeout_s": 1},
                )
        link.up = True

    async def _keep(self, link: WorkerLink) -> None:
        """Start the worker again whenever it dies, until the group stops."""
        backoff = 1.0
        while not self._stopping:
            proc = self._procs[link.index]
            assert proc is not None
            started = time.monotonic()
            code = await proc.wait()
            link.up = False
            if self._stopping or self._stop.is_set():
                return
            slot = WorkerSlot(link.index, len(self.links))
            lost = await asyncio.to_thread(self.store.interrupt_in_flight, slot.owns)
            _log.error(
                "gateway worker %d (pid %s) exited with status %s; %d calls in flight marked "
                "interrupted; starting it again",
                link.index,
                proc.pid,
                code,
                lost,
            )
            backoff = 1.0 if time.monotonic() - started > 60 else min(backoff * 2, 30.0)
            await asyncio.sleep(backoff)
            try:
                await self._start(link)
            except GroupError as exc:
                _log.error("%s", exc)

    async def _stop_all(self) -> None:
        procs = [p for p in self._procs if p is not None and p.returncode is None]
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), timeout=15)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()


def run_group(settings: GatewayConfig) -> None:
    """Serve until SIGINT or SIGTERM (``polar gateway --workers N``)."""
    import uvloop

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await Group(settings).run(stop)

    uvloop.run(main())
