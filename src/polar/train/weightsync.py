"""Weight sync: new weights into every engine without aborting a call.

One push, whatever the engines:

1. **pause** every gateway (``POST /admin/pause``): new calls wait at the
   gateway's gate; calls already in flight run to the end on the old weights
   (the gateway reports how many: ``drained_calls``). A gateway that does not
   drain within ``drain_timeout_s`` fails the try: gateways are resumed on the
   old version, nothing is loaded, and no call was cut short. The push tries
   again up to ``retries`` times, waiting ``backoff_s`` before the first retry
   and twice as long before each next one; after the last it raises
   :class:`DrainTimeout`, which leaves everything as it was (the caller may
   skip the push: the gateways still serve the old version, truthfully).
2. **load** the new weights into every engine (:mod:`polar.train.reload`).
3. **resume** every gateway with the new ``policy_version``: the waiting calls
   run on the new weights, and every record admitted from then on carries it.

If a load fails the gateways resume on the *old* version and the error is
raised at once, never retried (with several engines, the ones that already
loaded now disagree with the rest; the message names them).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from polar.train.config import GatewayTarget, WeightSyncSettings
from polar.train.reload import EngineReload, WeightSyncError, engine_reload
from polar.train.weights import WeightFormat, weight_format


class DrainTimeout(WeightSyncError):
    """Calls were still in flight after ``drain_timeout_s``, on every try: nothing
    was loaded and every gateway resumed on the version it had."""


@dataclass(frozen=True, slots=True)
class GatewayState:
    paused: bool
    inflight: int
    waiting: int
    policy_version: int


@dataclass(frozen=True, slots=True)
class Drain:
    drained: bool
    drained_calls: int
    waited_s: float


def rollout_gateways(
    server_url: str, token: str | None, *, wait_s: float = 30.0, poll_s: float = 0.5
) -> list[GatewayTarget]:
    """The gateways of the rollout server's nodes, with their admin tokens (``GET
    /gateways``, under the control token): a config that names none pushes to
    these. Waits up to ``wait_s`` for a first node (one just started registers
    within seconds); nodes that join later are not paused by this run."""
    from polar.rollout.client import RolloutClient, RolloutError

    deadline = time.monotonic() + wait_s
    with RolloutClient(server_url, token=token) as client:
        while True:
            try:
                found = client.gateways()
            except RolloutError as exc:
                raise WeightSyncError(
                    f"weight_sync.gateways: none given, and the rollout server did not "
                    f"list its nodes' gateways: {exc}"
                ) from None
            if found:
                return [GatewayTarget(url=g.url, admin_token=g.admin_token) for g in found]
            if time.monotonic() > deadline:
                raise WeightSyncError(
                    f"weight_sync.gateways: none given, and no node of the rollout server at "
                    f"{server_url} registered a gateway in {wait_s:g} s"
                )
            time.sleep(poll_s)


class GatewayAdmin:
    """A gateway's admin API, as far as weight sync needs it."""

    def __init__(self, target: GatewayTarget, *, timeout_s: float = 30.0) -> None:
        self.url = target.url
        self._http = httpx.Client(
            base_url=target.url,
            headers={"authorization": f"Bearer {target.admin_token}"},
            timeout=timeout_s,
        )

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            reply = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise WeightSyncError(f"gateway at {self.url}: {method} {path} failed: {exc}") from None
        if reply.status_code == 401:
            raise WeightSyncError(f"gateway at {self.url}: the admin token was refused")
        return reply

    def _json(self, reply: httpx.Response, what: str) -> dict[str, Any]:
        try:
            body = reply.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise WeightSyncError(
                f"gateway at {self.url}: {what}: HTTP {reply.status_code} {reply.text[:200]}"
            )
        return body

    def state(self) -> GatewayState:
        reply = self._call("GET", "/admin/status")
        body = self._json(reply, "GET /admin/status")
        if reply.status_code != 200 or "policy_version" not in body:
            raise WeightSyncError(
                f"gateway at {self.url}: GET /admin/status answered HTTP {reply.status_code}"
            )
        return GatewayState(
            paused=bool(body["paused"]),
            inflight=int(body["inflight"]),
            waiting=int(body.get("waiting", 0)),
            policy_version=int(body["policy_version"]),
        )

    def pause(self, timeout_s: float) -> Drain:
        reply = self._call(
            "POST", "/admin/pause", json={"timeout_s": timeout_s}, timeout=timeout_s + 30
        )
        body = self._json(reply, "pausing")
        if reply.status_code not in (200, 504):
            raise WeightSyncError(f"gateway at {self.url}: pausing: HTTP {reply.status_code}")
        return Drain(
            drained=bool(body.get("drained")),
            drained_calls=int(body.get("drained_calls", 0)),
            waited_s=float(body.get("waited_s", 0.0)),
        )

    def resume(self, policy_version: int | None) -> None:
        body = {} if policy_version is None else {"policy_version": policy_version}
        reply = self._call("POST", "/admin/resume", json=body)
        if reply.status_code != 200:
            raise WeightSyncError(f"gateway at {self.url}: resuming: HTTP {reply.status_code}")


@dataclass(frozen=True, slots=True)
class PushReport:
    version: int
    drained_calls: int
    """Calls in flight when the gateways paused: they finished on the old weights."""
    held_calls: int
    """Calls that arrived during the push and waited for the new weights."""
    drain_s: float
    load_s: float
    total_s: float
    """From the first try's pause to the resume (retries and their waits included)."""
    tries: int = 1
    """Pauses it took: 1, plus one per drain that timed out."""


class WeightSync:
    def __init__(
        self,
        gateways: Sequence[GatewayAdmin],
        engines: Sequence[EngineReload],
        *,
        drain_timeout_s: float,
        retries: int = 0,
        backoff_s: float = 0.0,
    ) -> None:
        self.gateways = list(gateways)
        self.engines = list(engines)
        self.drain_timeout_s = drain_timeout_s
        self.retries = retries
        self.backoff_s = backoff_s

    @classmethod
    def from_settings(
        cls, settings: WeightSyncSettings, *, adapter_name: str | None = None
    ) -> WeightSync:
        """``adapter_name``: the name LoRA adapters are served under (a LoRA run)."""
        return cls(
            [GatewayAdmin(g) for g in settings.gateways],
            [
                engine_reload(e, timeout_s=settings.request_timeout_s, adapter_name=adapter_name)
                for e in settings.engines
            ],
            drain_timeout_s=settings.drain_timeout_s,
            retries=settings.push_retries,
            backoff_s=settings.retry_backoff_s,
        )

    def close(self) -> None:
        for gateway in self.gateways:
            gateway.close()
        for engine in self.engines:
            engine.close()

    def check(self) -> list[int]:
        """Every gateway answers with the admin token and every engine can load
        weights; returns the gateways' policy versions."""
        versions = [g.state().policy_version for g in self.gateways]
        for engine in self.engines:
            engine.check()
        return versions

    def weight_format(self, dtype: str = "auto") -> WeightFormat:
        """How full weights are written for these engines: ``dtype``, or with
        ``auto`` the one they all serve (float32 unless every engine names the
        same narrower one); the output projection written out if any needs it."""
        head = any(engine.explicit_head for engine in self.engines)
        if dtype != "auto":
            return weight_format([dtype], explicit_head=head)
        return weight_format([engine.dtype() for engine in self.engines], explicit_head=head)

    def push(
        self, path: Path, version: int, *, on_retry: Callable[[str], None] | None = None
    ) -> PushReport:
        """Load ``path`` as ``version`` (see the module docstring); ``on_retry`` is
        told, in one line, why each retry happens."""
        start = time.monotonic()
        tries = 0
        while True:
            tries += 1
            try:
                return replace(self._try(path, version, start), tries=tries)
            except DrainTimeout as exc:
                if tries > self.retries:
                    raise DrainTimeout(
                        f"{exc} ({tries} {'try' if tries == 1 else 'tries'})"
                    ) from None
                wait = self.backoff_s * 2 ** (tries - 1)
                if on_retry is not None:
                    on_retry(f"weight push v{version}: {exc}; retrying in {wait:g}s")
                time.sleep(wait)

    def _try(self, path: Path, version: int, start: float) -> PushReport:
        paused: list[GatewayAdmin] = []
        drained_calls = 0
        loaded: list[str] = []
        try:
            for gateway in self.gateways:
                paused.append(gateway)
                drain = gateway.pause(self.drain_timeout_s)
                drained_calls += drain.drained_calls
                if not drain.drained:
                    raise DrainTimeout(
                        f"gateway at {gateway.url}: calls still in flight after "
                        f"{drain.waited_s:g}s; weights not pushed (no call was aborted)"
                    )
            drained_at = time.monotonic()
            for engine in self.engines:
                try:
                    engine.load(path, version)
                except WeightSyncError as exc:
                    if loaded:
                        raise WeightSyncError(
                            f"{exc} (already loaded version {version}: {', '.join(loaded)})"
                        ) from None
                    raise
                loaded.append(engine.target)
            loaded_at = time.monotonic()
        except BaseException:
            for gateway in paused:
                gateway.resume(None)
            raise
        held = sum(g.state().waiting for g in self.gateways)
        for gateway in self.gateways:
            gateway.resume(version)
        return PushReport(
            version=version,
            drained_calls=drained_calls,
            held_calls=held,
            drain_s=drained_at - start,
            load_s=loaded_at - drained_at,
            total_s=time.monotonic() - start,
        )
