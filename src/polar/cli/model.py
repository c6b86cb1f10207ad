"""``polar model``: build the models Polar runs on this machine."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="Build local models.", no_args_is_help=True, rich_markup_mode=None)

DEFAULT_MODEL_DIR = Path(".cache/models/tiny-qwen3")


@app.command("init")
def init(
    out: Annotated[Path, typer.Option(help="Directory to write the model to.")] = DEFAULT_MODEL_DIR,
    seed: Annotated[int, typer.Option(help="Random seed of the initial weights.")] = 0,
    force: Annotated[bool, typer.Option(help="Rebuild even if it exists.")] = False,
) -> None:
    """Build the default tiny model (Qwen3 architecture, random weights, Qwen3 tokenizer)."""
    from polar.tinymodel import TinyModelSpec, build_tiny_model, is_built

    spec = TinyModelSpec(seed=seed)
    existed = is_built(out, spec) and not force
    build_tiny_model(out, spec, force=force)
    typer.echo(f"{'kept' if existed else 'built'} {out}")
