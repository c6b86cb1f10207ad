"""Engines by name or ``package.module:factory``: what each capture mode accepts, and
an engine kind that leads nowhere as one ``engine.kind`` line."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from polar.configfile import ConfigError, load_config
from polar.ir import CaptureMode
from polar.proxy.call.capture import build_capture
from polar.proxy.config import GatewayConfig

ENGINE_URL = "http://127.0.0.1:9"  # nothing listens: building a capture connects to nothing


class RecordingEngine:
    """A plug-in engine that keeps the config it was built from."""

    name = "recording"

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.model = config.engine.model


def config(kind: str, capture: CaptureMode) -> GatewayConfig:
    return GatewayConfig.model_validate(
        {
            "admin_token": "0123456789abcdef0123",
            "capture": capture,
            "engine": {"kind": kind, "base_url": ENGINE_URL, "model": "m"},
            "render": {"engine_output": "engine_parser"},
        }
    )


@pytest.mark.parametrize(
    ("kind", "capture", "name"),
    [
        ("vllm", CaptureMode.ENGINE_RENDERED, "vllm"),
        ("sglang", CaptureMode.ENGINE_RENDERED, "sglang"),
        ("vllm", CaptureMode.TOKEN_IN_TOKEN_OUT, "vllm"),
        ("sglang", CaptureMode.TOKEN_IN_TOKEN_OUT, "sglang"),
        ("embedded", CaptureMode.TOKEN_IN_TOKEN_OUT, "embedded"),
    ],
)
def test_a_builtin_engine_is_found_by_name(kind: str, capture: CaptureMode, name: str) -> None:
    built: Any = build_capture(config(kind, capture))
    try:
        assert built.mode is capture
        assert built.engine.name == name
        assert built.engine.model == "m"
    finally:
        asyncio.run(built.engine.aclose())


def test_a_plugin_engine_gets_the_whole_gateway_config() -> None:
    settings = config(f"{__name__}:RecordingEngine", CaptureMode.ENGINE_RENDERED)

    built: Any = build_capture(settings)

    assert isinstance(built.engine, RecordingEngine)
    assert built.engine.config is settings


@pytest.mark.parametrize(
    ("kind", "capture", "message"),
    [
        (
            "tgi",
            CaptureMode.ENGINE_RENDERED,
            "engine.kind: unknown engine 'tgi'; use one of ['sglang', 'vllm'] "
            "or 'package.module:factory'",
        ),
        (
            "tgi",
            CaptureMode.TOKEN_IN_TOKEN_OUT,
            "engine.kind: unknown engine 'tgi'; use one of ['embedded', 'sglang', 'vllm'] "
            "or 'package.module:factory'",
        ),
        (
            "no_such_package_xyz.engines:Engine",
            CaptureMode.ENGINE_RENDERED,
            "engine.kind: engine no_such_package_xyz.engines:Engine: cannot import "
            "no_such_package_xyz.engines (No module named 'no_such_package_xyz')",
        ),
        (
            f"{__name__}:Missing",
            CaptureMode.ENGINE_RENDERED,
            f"engine.kind: engine {__name__}:Missing: {__name__} has no callable 'Missing'",
        ),
    ],
)
def test_an_engine_kind_that_leads_nowhere_is_one_config_line(
    kind: str, capture: CaptureMode, message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        build_capture(config(kind, capture))

    assert str(caught.value) == message


def test_the_embedded_engine_captures_token_in_token_out_unless_told_otherwise() -> None:
    raw = {
        "admin_token": "0123456789abcdef0123",
        "engine": {"kind": "embedded", "base_url": ENGINE_URL, "model": "m"},
    }

    assert load_config(GatewayConfig, None, raw).capture is CaptureMode.TOKEN_IN_TOKEN_OUT
    with pytest.raises(ConfigError) as caught:
        load_config(GatewayConfig, None, {**raw, "capture": "engine_rendered"})
    assert str(caught.value) == (
        "engine: Value error, the embedded engine takes token ids: use capture: "
        "token_in_token_out (its default)"
    )
