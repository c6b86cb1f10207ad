"""Loading new weights into a running engine, one class per engine kind.

Each reads a weight directory written by :func:`polar.train.weights.save_weights`
(the engine must see it at the same path): full weights, or only LoRA
adapters (:mod:`polar.adapters`). Each is checked before training starts
(:meth:`check`), so an engine that cannot update fails the run at start, not
at the first push, and says what it computes in (:meth:`dtype`), so full
weights are written once in that dtype (:func:`polar.train.weights.weight_format`).

- **embedded** (Polar's engine): ``POST /weights {"path", "version"}``, between
  batches; adapters are merged into its weights in place. ``GET /weights``
  names its dtype.
- **vLLM** (0.32): its development endpoints, served only with
  ``VLLM_SERVER_DEV_MODE=1``: ``POST /pause?mode=wait`` (finish what runs,
  hold new requests), ``POST /collective_rpc`` with ``reload_weights`` and
  ``{"weights_path"}`` (the workers reload in place from disk), ``POST
  /reset_prefix_cache`` (cached KV was computed with the old weights), ``POST
  /update_weight_version``, ``POST /resume``. vLLM's ``/update_weights``
  weight-transfer API moves tensors over NCCL or CUDA IPC, neither of which a
  CPU build has; reloading from disk works on every build. Adapters go through
  vLLM's LoRA API instead (served with ``--enable-lora`` and
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``): ``POST /v1/load_lora_adapter
  {"lora_name", "lora_path", "load_inplace": true}`` under the one name the
  gateway sends its calls to (``lora.served_name``), between the same pause
  and prefix-cache reset. ``GET /server_info`` (development mode) names its
  dtype.
- **SGLang**: ``POST /update_weights_from_disk {"model_path", "weight_version"}``
  (``{"success", "message", "num_paused_requests"}``, 400 when it failed and
  rolled back); ``GET /model_info`` (older servers: ``/get_model_info``) to check.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Protocol

import httpx

from polar.adapters import is_adapter
from polar.train.config import EngineKind, EngineTarget

_DTYPE = re.compile(r"\bdtype=(?:torch\.)?(float32|bfloat16|float16)\b")


class WeightSyncError(Exception):
    """A weight push or a pre-flight check failed; the message says where and why."""


class EngineReload(Protocol):
    @property
    def target(self) -> str:
        """The engine in words (kind and URL), for messages."""
        ...

    @property
    def explicit_head(self) -> bool:
        """Whether it needs a tied output projection written out (see
        :mod:`polar.train.weights`)."""
        ...

    def check(self) -> None:
        """Raise :class:`WeightSyncError` unless the engine can load new weights."""
        ...

    def dtype(self) -> str | None:
        """What its weights are in (``float32``, ``bfloat16``...), None if it does not say."""
        ...

    def load(self, path: Path, version: int) -> None:
        """Load the weights (or adapters) in ``path`` as policy ``version``; raise on failure."""
        ...

    def close(self) -> None: ...


class _HttpEngine:
    kind = "engine"
    explicit_head = True

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
    explicit_head = False  # it ties the output projection itself

    def _describe(self) -> dict[str, Any]:
        reply = self._call("GET", "/weights")
        if reply.status_code == 404:
            raise WeightSyncError(f"{self.target}: no /weights route: not Polar's embedded engine")
        body = self._ok(reply, "GET /weights")
        if not isinstance(body, dict) or "weights_version" not in body:
            raise WeightSyncError(f"{self.target}: GET /weights did not describe the weights")
        return body

    def check(self) -> None:
        self._describe()

    def dtype(self) -> str | None:
        value = self._describe().get("dtype")
        return str(value) if value is not None else None

    def load(self, path: Path, version: int) -> None:
        what = "loading adapters" if is_adapter(path) else "loading weights"
        self._ok(self._call("POST", "/weights", json={"path": str(path), "version": version}), what)


class VllmReload(_HttpEngine):
    kind = "vllm"

    def __init__(
        self, url: str, *, api_key: str | None, timeout_s: float, adapter_name: str | None = None
    ) -> None:
        super().__init__(url, api_key=api_key, timeout_s=timeout_s)
        self.adapter_name = adapter_name
        """The name adapters are served under (a LoRA run), else None."""

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
        # an empty body: 400/422 from the route, 404 when it is not served
        if (
            self.adapter_name is not None
            and self._call("POST", "/v1/load_lora_adapter", json={}).status_code == 404
        ):
            raise WeightSyncError(
                f"{self.target} cannot load LoRA adapters: start it with --enable-lora, "
                "--max-lora-rank at least lora.r, and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"
            )

    def dtype(self) -> str | None:
        reply = self._call("GET", "/server_info")
        if reply.status_code != 200:
            return None
        found = _DTYPE.search(reply.text)
        return found.group(1) if found else None

    def load(self, path: Path, version: int) -> None:
        adapter = is_adapter(path)
        if adapter and self.adapter_name is None:
            raise WeightSyncError(
                f"{self.target}: {path} holds LoRA adapters, and no name to serve"
            )
        self._ok(self._call("POST", "/pause", params={"mode": "wait"}), "pausing")
        try:
            if adapter:
                self._ok(
                    self._call(
                        "POST",
                        "/v1/load_lora_adapter",
                        json={
                            "lora_name": self.adapter_name,
                            "lora_path": str(path),
                            "load_inplace": True,
                        },
                    ),
                    f"loading adapters from {path}",
                )
            else:
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

    def dtype(self) -> str | None:
        return None

    def load(self, path: Path, version: int) -> None:
        if is_adapter(path):
            raise WeightSyncError(
                f"{self.target}: pushing LoRA adapters to SGLang is not supported"
            )
        reply = self._call(
            "POST",
            "/update_weights_from_disk",
            json={"model_path": str(path), "weight_version": str(version)},
        )
        body = self._ok(reply, f"updating weights from {path}")
        if not isinstance(body, dict) or body.get("success") is not True:
            raise WeightSyncError(f"{self.target}: update_weights_from_disk answered {body!r}")


def engine_reload(
    target: EngineTarget, *, timeout_s: float, adapter_name: str | None = None
) -> EngineReload:
    """The loader for ``target``; ``adapter_name``: a LoRA run's served adapter name."""
    match target.kind:
        case EngineKind.EMBEDDED:
            return EmbeddedReload(target.url, api_key=target.api_key, timeout_s=timeout_s)
        case EngineKind.VLLM:
            return VllmReload(
                target.url,
                api_key=target.api_key,
                timeout_s=timeout_s,
                adapter_name=adapter_name,
            )
        case EngineKind.SGLANG:
            return SglangReload(target.url, api_key=target.api_key, timeout_s=timeout_s)
