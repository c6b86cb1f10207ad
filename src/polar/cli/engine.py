"""``polar engine``: inference servers Polar provides itself."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from polar.assets import QWEN3_TOKENIZER_DIR
from polar.cli.errors import configure_logging, fail

app = typer.Typer(help="Run an inference server.", no_args_is_help=True, rich_markup_mode=None)


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
    import uvicorn

    from polar.proxy.engines.scripted import Script, ScriptedEngine, ScriptError
    from polar.proxy.engines.scripted.server import load_tokenizer

    try:
        parsed = Script.from_file(script)
    except ScriptError as exc:
        fail("engine scripted", str(exc))
    configure_logging("info")
    engine = ScriptedEngine(
        parsed, load_tokenizer(tokenizer), model=model, token_delay_s=token_delay_s
    )
    uvicorn.run(engine.app, host=host, port=port, log_level="warning")
