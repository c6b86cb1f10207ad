"""``polar train CONFIG.yaml``: the reference GRPO trainer."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from polar.cli.errors import configure_logging, fail


def train(
    config: Annotated[
        Path, typer.Argument(help="Training config (YAML); fields in polar.train.config.")
    ],
    steps: Annotated[int | None, typer.Option(help="Override the config's steps.")] = None,
    output_dir: Annotated[
        Path | None, typer.Option(help="Override the config's output_dir.")
    ] = None,
    device: Annotated[
        str | None,
        typer.Option(help="Override the config's device: auto, cpu, cuda or cuda:N."),
    ] = None,
) -> None:
    """Train a policy with GRPO on groups from a rollout server, pushing weights to the engines."""
    # The config is read and checked before torch and the trainer load (seconds).
    from polar.configfile import ConfigError
    from polar.train.config import load_train_config

    overrides: dict[str, object] = {}
    if steps is not None:
        overrides["steps"] = steps
    if output_dir is not None:
        overrides["output_dir"] = str(output_dir)
    if device is not None:
        overrides["device"] = device
    try:
        parsed = load_train_config(config, overrides)
    except ConfigError as exc:
        fail("train", str(exc))
    from polar.rollout.client import RolloutError
    from polar.train.checkpoint import CheckpointError
    from polar.train.reload import WeightSyncError
    from polar.train.trainer import TrainError
    from polar.train.trainer import train as run

    configure_logging("warning")
    try:
        result = run(parsed)
    except (TrainError, WeightSyncError, CheckpointError, RolloutError) as exc:
        fail("train", str(exc), code=1)
    if result.note is not None:
        typer.echo(result.note)
        return
    typer.echo(
        f"trained {result.steps} steps; policy version {result.policy_version}; "
        f"checkpoint {result.checkpoint}; metrics in {result.output_dir}"
    )
