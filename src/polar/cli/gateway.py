"""``polar gateway``: run the token-recording proxy."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from polar.cli.errors import configure_logging, fail
from polar.cli.listen import Listen, check_ports
from polar.configfile import ConfigError
from polar.ir import CaptureMode
from polar.proxy.config import GatewayConfig, load_gateway_config


def _overrides(**flags: Any) -> dict[str, Any]:
    """Nested config overrides from flags the user actually gave (``a__b`` -> ``a.b``)."""
    out: dict[str, Any] = {}
    for name, value in flags.items():
        if value is None:
            continue
        node = out
        *parents, leaf = name.split("__")
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return out


def gateway(
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="YAML config file; flags below override it."),
    ] = None,
    host: Annotated[
        str | None, typer.Option(help="Interface to listen on.", show_default="127.0.0.1")
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="Port to listen on.", show_default="8000")
    ] = None,
    admin_token: Annotated[
        str | None,
        typer.Option(
            envvar="POLAR_ADMIN_TOKEN",
            help="Token for the /admin endpoints (16+ characters).",
        ),
    ] = None,
    capture: Annotated[
        CaptureMode | None,
        typer.Option(help="How prompts are captured.", show_default="engine_rendered"),
    ] = None,
    engine_kind: Annotated[
        str | None,
        typer.Option(help="Engine: vllm, sglang, or package.module:factory.", show_default="vllm"),
    ] = None,
    engine_url: Annotated[
        str | None, typer.Option(help="Base URL of the inference server.")
    ] = None,
    engine_pool: Annotated[
        list[str] | None,
        typer.Option(
            help="Another server of the same model (repeat for several): calls are spread "
            "over all, each session sticking to one."
        ),
    ] = None,
    engine_model: Annotated[str | None, typer.Option(help="Model name the engine serves.")] = None,
    engine_api_key: Annotated[
        str | None,
        typer.Option(envvar="POLAR_ENGINE_API_KEY", help="Bearer token for the engine."),
    ] = None,
    engine_read_timeout_s: Annotated[
        float | None,
        typer.Option(
            help="Longest wait for the engine's reply to begin (its queue and prefill; for a "
            "reply that is not streamed, the whole generation), seconds. "
            "Silence once a reply has begun is --engine-idle-timeout-s.",
            show_default="900",
        ),
    ] = None,
    engine_idle_timeout_s: Annotated[
        float | None,
        typer.Option(
            help="Longest engine silence once a streamed reply has begun, seconds.",
            show_default="60",
        ),
    ] = None,
    engine_max_model_len: Annotated[
        int | None,
        typer.Option(
            help="The model's context length in tokens. Without it and without the engine's "
            "GET /v1/models, a call that asks for no output limit gets the engine's own "
            "default, 16 tokens on vLLM's completions route.",
            show_default="what the engine's GET /v1/models reports",
        ),
    ] = None,
    engine_max_attempts: Annotated[
        int | None,
        typer.Option(help="Attempts per call on transient engine failures.", show_default="3"),
    ] = None,
    render_tokenizer: Annotated[
        Path | None,
        typer.Option(
            help="Token-in/token-out: tokenizer directory with the model's chat template .",
            show_default="the bundled Qwen3 tokenizer",
        ),
    ] = None,
    render_tool_format: Annotated[
        str | None,
        typer.Option(help="Token-in/token-out: hermes or qwen3_coder.", show_default="hermes"),
    ] = None,
    render_tool_prompt: Annotated[
        str | None,
        typer.Option(
            help="Token-in/token-out: who writes tools, calls and results into the prompt: "
            "template, hermes (the gateway, for a template without a tool section) or auto "
            ".",
            show_default="auto, hermes when the template renders no tools",
        ),
    ] = None,
    render_reasoning: Annotated[
        bool | None,
        typer.Option(
            "--render-reasoning/--no-render-reasoning",
            help="Parse <think>...</think> as reasoning (off for a model that does not "
            "think, e.g. SmolLM2).",
            show_default="on",
        ),
    ] = None,
    store: Annotated[
        Path | None,
        typer.Option(help="SQLite record store.", show_default="runs/gateway/records.db"),
    ] = None,
    store_synchronous: Annotated[
        str | None,
        typer.Option(
            help="SQLite durability: normal (survives gateway crashes) or full (also power "
            "loss, fsync per call).",
            show_default="normal",
        ),
    ] = None,
    enforce_temperature: Annotated[
        float | None,
        typer.Option(
            help="Sampling policy enforced on every call (sampling.policy), whatever the "
            "harness asks: temperature.",
            show_default="none: the harness's settings stand",
        ),
    ] = None,
    enforce_top_p: Annotated[
        float | None,
        typer.Option(help="Enforced top-p (with the policy).", show_default="1"),
    ] = None,
    enforce_top_k: Annotated[
        int | None,
        typer.Option(help="Enforced top-k, 0 for none (with the policy).", show_default="0"),
    ] = None,
    max_body_bytes: Annotated[
        int | None, typer.Option(help="Largest accepted request body.", show_default="33554432")
    ] = None,
    pause_wait_s: Annotated[
        float | None,
        typer.Option(help="How long a call waits while the gateway is paused.", show_default="600"),
    ] = None,
    reasoning_field: Annotated[
        str | None,
        typer.Option(
            help="Chat Completions field carrying reasoning: reasoning_content, reasoning or none.",
            show_default="reasoning_content",
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            help="Gateway processes behind the one address; past 1, a router keeps each "
            "session on one worker.",
            show_default="1",
        ),
    ] = None,
    log_level: Annotated[
        str | None, typer.Option(help="debug, info, warning or error.", show_default="info")
    ] = None,
    check: Annotated[
        bool, typer.Option("--check", help="Validate the configuration, print it, and exit.")
    ] = False,
) -> None:
    """Run the gateway: harnesses call it as their model provider, it records every call."""
    overrides = _overrides(
        host=host,
        port=port,
        admin_token=admin_token,
        capture=capture.value if capture else None,
        engine__kind=engine_kind,
        engine__base_url=engine_url,
        engine__pool=engine_pool or None,
        engine__model=engine_model,
        engine__api_key=engine_api_key,
        engine__read_timeout_s=engine_read_timeout_s,
        engine__idle_timeout_s=engine_idle_timeout_s,
        engine__max_model_len=engine_max_model_len,
        engine__max_attempts=engine_max_attempts,
        render__tokenizer=str(render_tokenizer) if render_tokenizer else None,
        render__tool_format=render_tool_format,
        render__tool_prompt=render_tool_prompt,
        render__reasoning=render_reasoning,
        store__path=str(store) if store else None,
        store__synchronous=store_synchronous,
        sampling__policy__temperature=enforce_temperature,
        sampling__policy__top_p=enforce_top_p,
        sampling__policy__top_k=enforce_top_k,
        limits__max_body_bytes=max_body_bytes,
        limits__pause_wait_s=pause_wait_s,
        dialects__openai_chat__reasoning_field=reasoning_field,
        workers=workers,
        log_level=log_level,
    )
    from polar.proxy.call.capture import check_tokenizer
    from polar.proxy.engines.registry import check_engine

    try:
        settings = load_gateway_config(config, overrides)
        check_engine(settings)
        if check:
            check_tokenizer(settings)
    except ConfigError as exc:
        fail("gateway", str(exc))
    if check:
        typer.echo(
            settings.model_dump_json(indent=2, exclude={"admin_token": True, "engine": {"api_key"}})
        )
        return
    check_ports("gateway", Listen(settings.host, settings.port, "--port or port"))
    run_gateway(settings)


def run_gateway(settings: GatewayConfig) -> None:
    from polar.gctune import tune_for_serving
    from polar.malloctune import pin_mmap_threshold
    from polar.proxy.app import create_app
    from polar.proxy.front.httpwire import run_server
    from polar.proxy.gateway import Gateway

    configure_logging(settings.log_level)
    if settings.workers > 1:
        _run_group(settings)
        return
    pin_mmap_threshold()
    try:
        gateway_ = Gateway(settings)
    except ConfigError as exc:
        fail("gateway", str(exc))
    app = create_app(gateway_)
    tune_for_serving(settings.gc_young_threshold)
    run_server(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        keepalive_s=settings.keepalive_s,
    )


def _run_group(settings: GatewayConfig) -> None:
    from polar.proxy.store import StoreError
    from polar.proxy.workers.supervisor import GroupError, run_group

    try:
        run_group(settings)
    except (GroupError, StoreError) as exc:
        fail("gateway", str(exc), code=1)
