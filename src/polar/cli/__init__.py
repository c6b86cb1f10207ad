"""The ``polar`` command line.

One grammar across every command: ``-h``/``--help`` and ``polar --version``;
the short flags ``-c`` (``--config``), ``-f`` (``--format``) and ``-o``
(``--output``) mean the same wherever a command has them; defaults read
``[default: X]`` in every ``--help``; a failure is one line on stderr,
``polar <command>: error: <message>``, with exit status 2 for a usage or
configuration error and 1 for a failure at run time (:mod:`polar.cli.errors`).
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from polar import __version__
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
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(shown: bool) -> None:
    if shown:
        print(f"polar {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Polar: RL for unmodified coding-agent harnesses."""


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


THIRD_PARTY_QUIET = {"HF_HUB_DISABLE_PROGRESS_BARS": "1"}
"""Set for the process (unless already set) before anything imports transformers: its
bars ("Loading weights", downloads) would break into the commands' own output."""


def main() -> None:
    for name, value in THIRD_PARTY_QUIET.items():
        os.environ.setdefault(name, value)
    # Typer vendors Click (pinned in pyproject.toml); its usage errors are the one
    # kind of failure that does not go through polar.cli.errors.fail.
    from typer._click.exceptions import NoArgsIsHelpError, UsageError

    args = sys.argv[1:]
    if "--version" in args[: args.index("--") if "--" in args else None]:
        print(f"polar {__version__}")  # after any command too: polar build --version
        sys.exit(0)
    try:
        code = typer.main.get_command(app).main(prog_name="polar", standalone_mode=False)
    except NoArgsIsHelpError as exc:  # `polar` or `polar harness` alone: the help
        exc.show()
        sys.exit(exc.exit_code)
    except UsageError as exc:
        path = exc.ctx.command_path if exc.ctx is not None else "polar"
        message = exc.format_message().rstrip(".")
        print(f"{path}: error: {message} (see {path} -h)", file=sys.stderr)
        sys.exit(exc.exit_code)
    except typer.Abort:
        print("polar: aborted", file=sys.stderr)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
