"""Loading new weights into a running engine, one class per engine kind.

Each reads a weight directory written by :func:`polar.train.weights.save_weights`
(the engine must see it at the same path) and is checked before training
starts (:meth:`check`), so an engine that cannot update fails the run at
start, not at the first push.

- **embedded** (Polar's CPU engine): ``POST /weights {"path"}``, between batches.
- **vLLM** (0.32): its development endpoints, served only with
  ``VLLM_SERVER_DEV_MODE=1``: ``POST /pause?mode=wait`` (finish what runs,
  hold new requests), ``POST /collective_rpc`` with ``reload_weights`` and
  ``{"weights_path"}`` (the workers reload in place from disk), ``POST
  /reset_prefix_cache`` (cached KV was computed with the old weights), ``POST
  /update_weight_version``, ``POST /resume``. vLLM's ``/update_weights``
  weight-transfer API moves tensors over NCCL or CUDA IPC, neither of which a
  CPU build has; reloading from disk works on every build.
- **SGLang**: ``POST /update_weights_from_disk {"model_path", "weight_version"}``
  (``{"success", "message", "num_paused_requests"}``, 400 when it failed and
  rolled back); ``GET /model_info`` (older servers: ``/get_model_info``) to check.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import httpx

from polar.train.config import EngineKind, EngineTarget


class WeightSyncError(Exception):
    """A weight push or a pre-flight check failed; the message says where and why."""


class EngineReload(Protocol):
    @property
    def target(self) -> str:
        """The engine in words (kind and URL), for messages."""
        ...

    def check(self) -> None:
        """Raise :class:`WeightSyncError` unless the engine can load new weights."""
        ...

    def load(self, path: Path, version: int) -> None:
        """Load the weights in ``path`` as policy ``version``; raise on failure."""
        ...

    def close(self) -> None: ...


class _HttpEngine:
    kind = "engine"

    def __init__(self, url: str, *, api_key: str | None, timeout_s: float) -> None:
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = url
        self._http = httpx.Client(base_url=url, headers=headers, timeout=timeout_s)

    @property
    def target(self) -> str:
        return f"{self.kind} engine at {self.url}"

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise WeightSyncError(f"{self.target}: {method} {path} failed: {exc}") from None

    def _ok(self, reply: httpx.Response, what: str) -> Any:
        if reply.status_code >= 400:
            raise WeightSyncError(f"{self.target}: {what}: {_message(reply)}")
        try:
            return reply.json()
        except ValueError:
            return None


def _message(reply: httpx.Response) -> str:
    try:
        body = reply.json()
    except ValueError:
        return f"HTTP {reply.status_code} {reply.text[:200]}"
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and "message" in error:
            return f"HTTP {reply.status_code}: {error['message']}"
        for key in ("message", "detail", "error"):
            if key in body:
                return f"HTTP {reply.status_code}: {body[key]}"
    return f"HTTP {reply.status_code}: {str(body)[:200]}"


class EmbeddedReload(_HttpEngine):
    kind = "embedded"

    def check(self) -> None:
        reply = self._call("GET", "/weights")
        if reply.status_code == 404:
            raise WeightSyncError(f"{self.target}: no /weights route: not Polar's embedded engine")
        body = self._ok(reply, "GET /weights")
        if not isinstance(body, dict) or "weights_version" not in body:
            raise WeightSyncError(f"{self.target}: GET /weights did not describe the weights")

    def load(self, path: Path, version: int) -> None:
        self._ok(self._call("POST", "/weights", json={"path": str(path)}), "loading weights")


class VllmReload(_HttpEngine):
    kind = "vllm"

    def check(self) -> None:
        reply = self._call("GET", "/is_paused")
        if reply.status_code == 404:
            raise WeightSyncError(
                f"{self.target} cannot update its weights: start it with VLLM_SERVER_DEV_MODE=1 "
                "(/pause, /collective_rpc and /reset_prefix_cache are development endpoints)"
            )
        body = self._ok(reply, "GET /is_paused")
        if not isinstance(body, dict) or "is_paused" not in body:
            raise WeightSyncError(f"{self.target}: GET /is_paused answered {body!r}")

    def load(self, path: Path, version: int) -> None:
        self._ok(self._call("POST", "/pause", params={"mode": "wait"}), "pausing")
        try:
            self._ok(
                self._call(
                    "POST",
                    "/collective_rpc",
                    json={"method": "reload_weights", "kwargs": {"weights_path": str(path)}},
                ),
                f"reloading weights from {path}",
            )
            reset = self._ok(self._call("POST", "/reset_prefix_cache"), "resetting the cache")
            if isinstance(reset, dict) and reset.get("success") is False:
                raise WeightSyncError(
                    f"{self.target}: the prefix cache could not be reset (blocks still held)"
                )
            self._ok(
                self._call("POST", "/update_weight_version", json={"new_version": str(version)}),
                "setting the weight version",
            )
        finally:
            self._ok(self._call("POST", "/resume"), "resuming")


class SglangReload(_HttpEngine):
    kind = "sglang"

    def check(self) -> None:
        for path in ("/model_info", "/get_model_info"):
            reply = self._call("GET", path)
            if reply.status_code != 404:
                self._ok(reply, f"GET {path}")
                return
        raise WeightSyncError(f"{self.target}: neither /model_info nor /get_model_info: not SGLang")

    def load(self, path: Path, version: int) -> None:
        reply = self._call(
            "POST",
            "/update_weights_from_disk",
            json={"model_path": str(path), "weight_version": str(version)},
        )
        body = self._ok(reply, f"updating weights from {path}")
        if not isinstance(body, dict) or body.get("success") is not True:
            raise WeightSyncError(f"{self.target}: update_weights_from_disk answered {body!r}")


def engine_reload(target: EngineTarget, *, timeout_s: float) -> EngineReload:
    match target.kind:
        case EngineKind.EMBEDDED:
            return EmbeddedReload(target.url, api_key=target.api_key, timeout_s=timeout_s)
        case EngineKind.VLLM:
            return VllmReload(target.url, api_key=target.api_key, timeout_s=timeout_s)
        case EngineKind.SGLANG:
            return SglangReload(target.url, api_key=target.api_key, timeout_s=timeout_s)
