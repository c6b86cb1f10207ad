"""Engines and capture modes by name: built-ins, or ``package.module:factory`` plug-ins.

A plug-in factory takes the :class:`~polar.proxy.config.GatewayConfig` and
returns a :class:`~polar.proxy.engines.base.ChatEngine` (engine-rendered
capture) or a :class:`~polar.proxy.engines.base.TokenEngine`
(token-in/token-out), matching the configured capture mode.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from polar.assets import QWEN3_TOKENIZER_DIR
from polar.ir import CaptureMode
from polar.proxy.capture import Capture, EngineRendered, GatewayRendered, Reparse
from polar.proxy.config import ConfigError, EngineConfig, GatewayConfig
from polar.proxy.engines.base import ChatEngine, TokenEngine
from polar.proxy.engines.sglang import SglangChatEngine
from polar.proxy.engines.sglang_tokens import SglangTokenEngine
from polar.proxy.engines.transport import EngineTransport
from polar.proxy.engines.vllm import VllmChatEngine
from polar.proxy.engines.vllm_tokens import VllmTokenEngine
from polar.proxy.maxtokens import ContextWindow, context_from_models
from polar.proxy.offload import Offload
from polar.proxy.render.parse import ParserOptions, ToolFormat
from polar.proxy.render.template import ChatTemplate


def _transport(config: EngineConfig) -> EngineTransport:
    return EngineTransport(
        config.base_url,
        api_key=config.api_key,
        connect_timeout_s=config.connect_timeout_s,
        read_timeout_s=config.read_timeout_s,
        idle_timeout_s=config.idle_timeout_s,
        total_timeout_s=config.total_timeout_s,
        max_connections=config.max_connections,
    )


CHAT_ENGINES: dict[str, Callable[[EngineConfig], ChatEngine]] = {
    "vllm": lambda c: VllmChatEngine(
        _transport(c), model=c.model, template_kwargs=c.template_kwargs
    ),
    "sglang": lambda c: SglangChatEngine(
        _transport(c), model=c.model, template_kwargs=c.template_kwargs
    ),
}

TOKEN_ENGINES: dict[str, Callable[[EngineConfig], TokenEngine]] = {
    "vllm": lambda c: VllmTokenEngine(_transport(c), model=c.model),
    "embedded": lambda c: VllmTokenEngine(_transport(c), model=c.model, name="embedded"),
    "sglang": lambda c: SglangTokenEngine(_transport(c), model=c.model),
}


def _plugin(kind: str) -> Callable[[GatewayConfig], Any]:
    module_name, _, attr = kind.partition(":")
    if not attr:
        raise ConfigError(
            f"engine.kind: unknown engine {kind!r}; use one of "
            f"{sorted(set(CHAT_ENGINES) | set(TOKEN_ENGINES))} or 'package.module:factory'"
        )
    try:
        factory: Callable[[GatewayConfig], Any] = getattr(
            importlib.import_module(module_name), attr
        )
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"engine.kind: cannot load {kind!r} ({exc})") from None
    return factory


def load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def context_window(config: EngineConfig) -> ContextWindow:
    """The configured context length, else the engine's ``max_model_len`` (asked once)."""

    async def fetch() -> int | None:
        transport = _transport(config.model_copy(update={"max_connections": 1}))
        try:
            return context_from_models(await transport.get_json("/v1/models"), config.model)
        finally:
            await transport.aclose()

    return ContextWindow(config.max_model_len, fetch, default_max_tokens=config.default_max_tokens)


def build_capture(
    config: GatewayConfig, *, template: ChatTemplate | None = None, offload: Offload | None = None
) -> Capture:
    """The capture ``config`` describes. ``template``: the chat template
    ``config.render`` names, already loaded (gateways in one process can share
    one; loading a tokenizer takes a good part of a second). ``offload``: the
    workers that render prompts (token-in/token-out), the gateway's own."""
    kind = config.engine.kind
    context = context_window(config.engine)
    if config.capture is CaptureMode.ENGINE_RENDERED:
        if kind == "embedded":
            raise ConfigError(
                "engine.kind: the embedded engine takes token ids; use capture: token_in_token_out"
            )
        chat = CHAT_ENGINES[kind](config.engine) if kind in CHAT_ENGINES else _plugin(kind)(config)
        if config.render.engine_output == "engine_parser":
            return EngineRendered(chat, context=context)
        template = template or _template(config)
        return EngineRendered(
            chat,
            context=context,
            reparse=Reparse(
                text=template.text,
                parser=_parser_options(config),
                stop_token_ids=(template.end_of_turn_id, *config.render.stop_token_ids),
            ),
        )
    tokens = TOKEN_ENGINES[kind](config.engine) if kind in TOKEN_ENGINES else _plugin(kind)(config)
    return GatewayRendered(
        template or _template(config),
        tokens,
        parser=_parser_options(config),
        stop_token_ids=tuple(config.render.stop_token_ids),
        context=context,
        offload=offload,
    )


def _template(config: GatewayConfig) -> ChatTemplate:
    render = config.render
    path = render.tokenizer or QWEN3_TOKENIZER_DIR
    try:
        tokenizer = load_tokenizer(str(path))
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"render.tokenizer: cannot load a tokenizer from {path} ({exc})"
        ) from None
    try:
        return ChatTemplate(
            tokenizer, template_kwargs=render.template_kwargs, end_of_turn=render.end_of_turn
        )
    except ValueError as exc:
        raise ConfigError(f"render.end_of_turn: {exc}") from None


def _parser_options(config: GatewayConfig) -> ParserOptions:
    render = config.render
    return ParserOptions(tool_format=ToolFormat(render.tool_format), reasoning=render.reasoning)
