"""Engines by name: built-ins, or ``package.module:factory`` plug-ins.

A plug-in factory takes the :class:`~polar.proxy.config.GatewayConfig` and
returns a :class:`~polar.proxy.engines.base.ChatEngine` (engine-rendered
capture) or a :class:`~polar.proxy.engines.base.TokenEngine`
(token-in/token-out), matching the configured capture mode.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from polar.configfile import ConfigError
from polar.ir import CaptureMode
from polar.plugins import load_factory
from polar.proxy.call.maxtokens import ContextWindow, context_from_models
from polar.proxy.config import EngineConfig, GatewayConfig
from polar.proxy.engines.base import ChatEngine, TokenEngine
from polar.proxy.engines.pool import EnginePool
from polar.proxy.engines.sglang import SglangChatEngine
from polar.proxy.engines.sglang_tokens import SglangTokenEngine
from polar.proxy.engines.transport import EngineTransport, Transport
from polar.proxy.engines.vllm import VllmChatEngine
from polar.proxy.engines.vllm_tokens import VllmTokenEngine


def _transport(config: EngineConfig) -> Transport:
    """One engine's transport, or a pool of them when ``engine.pool`` names more."""
    if len(config.urls) == 1:
        return _one(config, config.base_url)
    return EnginePool([_one(config, url) for url in config.urls], eject_s=config.eject_s)


def _one(config: EngineConfig, url: str) -> EngineTransport:
    return EngineTransport(
        url,
        api_key=config.api_key,
        connect_timeout_s=config.connect_timeout_s,
        read_timeout_s=config.read_timeout_s,
        idle_timeout_s=config.idle_timeout_s,
        total_timeout_s=config.total_timeout_s,
        max_connections=config.max_connections,
        keepalive_s=config.keepalive_s,
    )


CHAT_ENGINES: Mapping[str, Callable[[GatewayConfig], ChatEngine]] = {
    "vllm": lambda c: VllmChatEngine(
        _transport(c.engine), model=c.engine.model, template_kwargs=c.engine.template_kwargs
    ),
    "sglang": lambda c: SglangChatEngine(
        _transport(c.engine), model=c.engine.model, template_kwargs=c.engine.template_kwargs
    ),
}

TOKEN_ENGINES: Mapping[str, Callable[[GatewayConfig], TokenEngine]] = {
    "vllm": lambda c: VllmTokenEngine(_transport(c.engine), model=c.engine.model),
    "embedded": lambda c: VllmTokenEngine(
        _transport(c.engine), model=c.engine.model, name="embedded"
    ),
    "sglang": lambda c: SglangTokenEngine(_transport(c.engine), model=c.engine.model),
}
"""Built-in engines by capture mode; a plug-in factory is called the same way,
with the whole gateway config."""


def engine_factory(kind: str, builtins: Mapping[str, object]) -> Callable[[GatewayConfig], Any]:
    """The factory of engine ``kind``: a built-in of ``builtins``, or a plug-in."""
    return load_factory(
        kind,
        kind="engine",
        known=builtins,
        error=lambda message: ConfigError(f"engine.kind: {message}"),
    )


def check_engine(config: GatewayConfig) -> None:
    """What building the gateway's engine checks first, without building it: that
    ``engine.kind`` leads to a factory for the capture mode (``--check``)."""
    token_in = config.capture is CaptureMode.TOKEN_IN_TOKEN_OUT
    engine_factory(config.engine.kind, TOKEN_ENGINES if token_in else CHAT_ENGINES)


def context_window(config: EngineConfig) -> ContextWindow:
    """The configured context length, else the engine's ``max_model_len``, asked when
    the gateway starts and in the background until the engine answers."""

    async def fetch() -> int | None:
        transport = _one(config.model_copy(update={"max_connections": 1}), config.base_url)
        try:
            return context_from_models(await transport.get_json("/v1/models"), config.model)
        finally:
            await transport.aclose()

    return ContextWindow(config.max_model_len, fetch, default_max_tokens=config.default_max_tokens)
