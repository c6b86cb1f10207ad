"""Engines by name: built-ins, or any ``package.module:factory`` plug-in.

A plug-in factory takes the :class:`~polar.proxy.config.EngineConfig` and
returns an object satisfying :class:`~polar.proxy.engines.base.ChatEngine`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from polar.proxy.config import ConfigError, EngineConfig
from polar.proxy.engines.base import ChatEngine
from polar.proxy.engines.sglang import SglangChatEngine
from polar.proxy.engines.transport import EngineTransport
from polar.proxy.engines.vllm import VllmChatEngine


def _transport(config: EngineConfig) -> EngineTransport:
    return EngineTransport(
        config.base_url,
        api_key=config.api_key,
        connect_timeout_s=config.connect_timeout_s,
        read_timeout_s=config.read_timeout_s,
        max_connections=config.max_connections,
    )


def _vllm(config: EngineConfig) -> ChatEngine:
    return VllmChatEngine(
        _transport(config), model=config.model, template_kwargs=config.template_kwargs
    )


def _sglang(config: EngineConfig) -> ChatEngine:
    return SglangChatEngine(
        _transport(config), model=config.model, template_kwargs=config.template_kwargs
    )


BUILTIN: dict[str, Callable[[EngineConfig], ChatEngine]] = {"vllm": _vllm, "sglang": _sglang}


def build_engine(config: EngineConfig) -> ChatEngine:
    factory = BUILTIN.get(config.kind)
    if factory is None:
        module_name, _, attr = config.kind.partition(":")
        if not attr:
            raise ConfigError(
                f"engine.kind: unknown engine {config.kind!r}; use one of "
                f"{sorted(BUILTIN)} or 'package.module:factory'"
            )
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"engine.kind: cannot load {config.kind!r} ({exc})") from None
    return factory(config)
