"""Command-line options that several commands take, declared once.

``polar serve`` and ``polar node`` start the same node; ``polar submit``,
``polar status`` and ``polar generate`` talk to the same rollout server and
run the same harnesses. Each shared option is one annotated type here, so its
flag, environment variable and help read the same in every command.
"""

from __future__ import annotations

from typing import Annotated

import typer

TOKEN_ENV = "POLAR_CONTROL_TOKEN"
DEFAULT_SERVER = "http://127.0.0.1:8200"

# ---------------------------------------------------------------- a node and its gateway

EngineUrl = Annotated[
    str | None, typer.Option(help="Inference engine the node's gateway forwards to.")
]
EngineKind = Annotated[
    str | None,
    typer.Option(help="vllm, sglang, embedded, or package.module:factory.", show_default="vllm"),
]
EngineModel = Annotated[
    str | None,
    typer.Option(help="The model name the engine serves (polar engine serve: its --served-name)."),
]
ControlPort = Annotated[int | None, typer.Option(help="The node's API port.", show_default="8301")]
LogLevel = Annotated[str, typer.Option(help="debug, info, warning or error.")]
Check = Annotated[bool, typer.Option("--check", help="Validate, print, exit.")]

# ---------------------------------------------------------------- the rollout server's clients

ControlToken = Annotated[
    str | None,
    typer.Option(
        envvar=TOKEN_ENV,
        help="Control token (16+ visible ASCII characters; polar serve generates one "
        "when none is given).",
    ),
]
ServerUrl = Annotated[str, typer.Option(help="Rollout server URL.")]

# ---------------------------------------------------------------- tasks and harnesses

TaskSource = Annotated[
    str, typer.Argument(help="Task file (.jsonl/.yaml/.parquet), Harbor dir, or 'builtin'.")
]
HarnessRef = Annotated[str, typer.Option(help="Harness preset or package.module:factory.")]
HarnessOptions = Annotated[
    list[str] | None, typer.Option(help="Harness option KEY=VALUE (repeatable; JSON values).")
]
TaskIds = Annotated[
    list[str] | None, typer.Option("--task", help="Only these task ids (repeatable).")
]
SessionTimeout = Annotated[float, typer.Option(help="Each session's agent budget, seconds.")]
