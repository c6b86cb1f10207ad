"""``polar demo``: the main job on this machine, end to end, in one command.

A real pretrained model (SmolLM2-135M-Instruct, converted once by ``polar
model smollm2``) learns to write Python functions with GRPO, through the
whole stack: the embedded CPU engine, a rollout server and a gateway node
(token-in/token-out, sandboxed sessions, the pytest evaluator), the reference
trainer and its weight pushes (:mod:`polar.train.demo`). Held-out tasks are
evaluated before and after. Under a quarter of an hour on two cores.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from polar.cli.errors import fail


def demo(
    model: Annotated[
        Path, typer.Option(help="The model (built by `polar model smollm2` when missing).")
    ] = Path(".cache/models/smollm2-135m-instruct"),
    workdir: Annotated[
        Path, typer.Option(help="Where records, metrics and sessions go (emptied first).")
    ] = Path("runs/demo"),
    steps: Annotated[int, typer.Option(min=1, help="GRPO steps.")] = 4,
    heldout: Annotated[int, typer.Option(min=1, help="Held-out tasks evaluated.")] = 12,
    group_size: Annotated[int, typer.Option(min=2, help="Sessions per task (a group).")] = 4,
    groups_per_step: Annotated[int, typer.Option(min=1, help="Tasks per step.")] = 2,
    seed: Annotated[int, typer.Option(help="Seed of the task order and the trainer.")] = 0,
) -> None:
    """Train a real model on coding tasks here, and show held-out pass before and after."""
    from polar.smollm2 import DEFAULT_DIR, ConversionError, build_smollm2
    from polar.train.demo import DemoSettings, run_demo

    typer.echo("Polar demo: a coding agent learning with GRPO on this machine (CPU only).")
    if model == DEFAULT_DIR and not (model / "config.json").is_file():
        typer.echo("      converting SmolLM2-135M-Instruct (once, about half a minute)")
        try:
            build_smollm2(model)
        except ConversionError as exc:
            fail("demo", str(exc), code=1)
    if not (model / "config.json").is_file():
        fail("demo", f"no model in {model} (build it with: polar model smollm2)", code=1)
    typer.echo(f"[1/5] model: {model}")
    settings = DemoSettings(
        model=model,
        workdir=workdir,
        steps=steps,
        heldout=heldout,
        group_size=group_size,
        groups_per_step=groups_per_step,
        seed=seed,
    )
    result = run_demo(settings, typer.echo)
    typer.echo(
        f"\nHeld-out pass@1: {result.before:.0%} before, {result.after:.0%} after "
        f"{result.steps} GRPO steps ({result.heldout} tasks, policy v{result.policy_version}, "
        f"{result.minutes:.1f} minutes)."
    )
    root = result.workdir
    typer.echo(
        "Look next:\n"
        f"  .venv/bin/polar dashboard --store {root}/records.db --metrics {root}/train "
        f"--tokenizer {model}\n"
        f"  .venv/bin/polar records --store {root}/records.db\n"
        f"  .venv/bin/polar build SESSION --store {root}/records.db --tokenizer {model}\n"
        "  (a longer run and its curve: benchmarks/learning.py, docs/figures/)"
    )
