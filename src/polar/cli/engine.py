"""``polar engine``: inference servers Polar provides itself."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from polar.assets import QWEN3_TOKENIZER_DIR
from polar.cli.errors import configure_logging, fail
from polar.cli.listen import Listen, check_ports, serve_app
from polar.cli.model import DEFAULT_MODEL_DIR

app = typer.Typer(help="Run an inference server.", no_args_is_help=True, rich_markup_mode=None)


@app.command("serve")
def serve(
    model: Annotated[
        Path, typer.Option(help="Hugging Face model directory (polar model init builds one).")
    ] = DEFAULT_MODEL_DIR,
    served_name: Annotated[str, typer.Option(help="Model name clients use.")] = "tiny",
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8011,
    max_batch: Annotated[int, typer.Option(help="Most requests generated together.")] = 8,
    threads: Annotated[int, typer.Option(help="Torch threads (0: torch's default).")] = 0,
    device: Annotated[
        str,
        typer.Option(
            help="auto (the first GPU, else the CPU), cpu, cuda or cuda:N; float32 on the "
            "CPU, bfloat16 on a GPU."
        ),
    ] = "auto",
    max_memory_gib: Annotated[
        float,
        typer.Option(
            help="Most memory a batch may take (KV cache, prefill); larger requests "
            "are refused with a 400."
        ),
    ] = 4.0,
    prefill_chunk: Annotated[
        int, typer.Option(help="Prompt positions prefilled at once (bounds attention memory).")
    ] = 1024,
    logprobs_mode: Annotated[
        str,
        typer.Option(
            help="processed: logprobs of the distribution sampled from (after temperature, "
            "min-p, top-k, top-p; what a trainer corrects against); raw: of the model's own "
            "(vLLM's default). A gateway in front must say the same (engine.logprobs)."
        ),
    ] = "processed",
) -> None:
    """Serve a causal LM with vLLM's token-in completions API (the embedded engine)."""
    from polar.device import DeviceError, check_device, resolve_device

    try:
        check_device(device)
    except ValueError as exc:
        fail("engine serve", f"--device: {exc}")
    if logprobs_mode not in ("raw", "processed"):
        fail("engine serve", "--logprobs-mode must be raw or processed")
    if max_memory_gib <= 0 or prefill_chunk < 1:
        fail("engine serve", "--max-memory-gib must be positive and --prefill-chunk at least 1")
    if not (model / "config.json").exists():
        fail(
            "engine serve", f"no model in {model} (build one with: polar model init --out {model})"
        )
    check_ports("engine serve", Listen(host, port, "--port"))  # before torch loads

    from polar.proxy.engines.embedded import ModelRunner, create_engine_app

    try:
        where = resolve_device(device)
    except DeviceError as exc:
        fail("engine serve", str(exc))
    configure_logging("info")
    started = time.monotonic()
    typer.echo(f"polar engine serve: loading {model} on {where} ...", err=True)
    runner = ModelRunner(
        model,
        max_batch=max_batch,
        threads=threads or None,
        logprobs_mode="raw" if logprobs_mode == "raw" else "processed",
        prefill_chunk=prefill_chunk,
        max_memory_bytes=int(max_memory_gib * 2**30),
        device=where,
    )
    typer.echo(
        f"polar engine serve: loaded in {time.monotonic() - started:.1f} s "
        f"({runner.max_model_len} tokens of context, logprobs {logprobs_mode})",
        err=True,
    )
    try:
        serve_app(
            "engine serve",
            create_engine_app(runner, served_name=served_name),
            host,
            port,
            f"model {served_name!r} at {{url}}v1 (Ctrl-C stops it)",
        )
    finally:
        runner.close()


@app.command("scripted")
def scripted(
    script: Annotated[Path, typer.Option(help="YAML/JSON script of assistant turns.")],
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8011,
    model: Annotated[str, typer.Option(help="Model name to serve.")] = "scripted",
    tokenizer: Annotated[Path, typer.Option(help="Tokenizer directory.")] = QWEN3_TOKENIZER_DIR,
    token_delay_s: Annotated[
        float, typer.Option(help="Pause before each streamed token, seconds.")
    ] = 0.0,
) -> None:
    """Serve a scripted model with vLLM's wire format (for tests and demos)."""
    from polar.testing.scripted import ScriptedEngine, ScriptError, load_script
    from polar.tokenizer import load_tokenizer

    try:
        parsed = load_script(script)
    except ScriptError as exc:
        fail("engine scripted", str(exc))
    check_ports("engine scripted", Listen(host, port, "--port"))
    configure_logging("info")
    engine = ScriptedEngine(
        parsed, load_tokenizer(tokenizer), model=model, token_delay_s=token_delay_s
    )
    serve_app("engine scripted", engine.app, host, port, f"model {model!r} at {{url}}v1")
