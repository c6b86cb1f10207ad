"""The ``polar`` command line."""

from __future__ import annotations

import typer

from polar.cli import (
    build,
    dashboard,
    demo,
    engine,
    gateway,
    harness,
    model,
    records,
    rollout,
    sft,
    train,
)

app = typer.Typer(
    name="polar",
    help="Polar: RL for unmodified coding-agent harnesses.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
app.command("gateway")(gateway.gateway)
app.command("records")(records.records)
app.command("build")(build.build)
app.command("demo")(demo.demo)
app.command("serve")(rollout.serve)
app.command("node")(rollout.node)
app.command("submit")(rollout.submit)
app.command("status")(rollout.status)
app.command("cancel")(rollout.cancel)
app.command("generate")(sft.generate)
app.command("sft")(sft.sft)
app.command("train")(train.train)
app.command("dashboard")(dashboard.dashboard)
app.add_typer(model.app, name="model")
app.add_typer(engine.app, name="engine")
app.add_typer(harness.app, name="harness")


def main() -> None:
    app()
