"""``polar generate`` (SFT data through the rollout service) and ``polar sft``
(fine-tuning on it)."""

from __future__ import annotations

import secrets
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from polar.cli.errors import configure_logging, fail
from polar.cli.options import (
    ControlToken,
    EngineKind,
    EngineModel,
    EngineUrl,
    HarnessOptions,
    HarnessRef,
    SessionTimeout,
    TaskIds,
    TaskSource,
)
from polar.cli.rollout import (
    ServeConfig,
    load_selected,
    node_defaults,
    parse_option,
    read_config,
    validate_config,
)


def generate(
    tasks: TaskSource,
    harness: HarnessRef,
    out: Annotated[Path, typer.Option(help="Output directory (rerun with it to resume).")],
    attempts: Annotated[int, typer.Option(help="Attempts per task.")] = 4,
    accept: Annotated[
        str, typer.Option(help="Acceptance rule over reward and resolved.")
    ] = "reward >= 1",
    option: HarnessOptions = None,
    task_id: TaskIds = None,
    timeout: SessionTimeout = 1800,
    server_url: Annotated[
        str | None,
        typer.Option(help="Use this rollout server.", show_default="start one in this process"),
    ] = None,
    token: ControlToken = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="The local service's YAML (polar serve's format)."),
    ] = None,
    engine_url: EngineUrl = None,
    engine_kind: EngineKind = None,
    engine_model: EngineModel = None,
    max_in_flight: Annotated[int, typer.Option(help="Attempts submitted at once.")] = 64,
    dedupe: Annotated[bool, typer.Option(help="Drop repeats of an accepted solution.")] = True,
    keep_side_calls: Annotated[
        bool, typer.Option(help="Export side-call chains too (titles, summaries).")
    ] = False,
    max_tokens: Annotated[
        int | None, typer.Option(help="Drop traces longer than this (prompt + response).")
    ] = None,
    per_task_cap: Annotated[
        int | None, typer.Option(help="Accept at most this many attempts per task.")
    ] = None,
    fmt: Annotated[
        list[str] | None,
        typer.Option("--format", "-f", help="jsonl and/or parquet.", show_default="both"),
    ] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "warning",
) -> None:
    """Generate SFT data: attempts through the rollout service, judged, exported."""
    from pydantic import ValidationError

    from polar.configfile import ConfigError, describe_error
    from polar.rollout.client import RolloutClient, RolloutError
    from polar.rollout.protocol import HarnessSpec
    from polar.sft.accept import AcceptError
    from polar.sft.generate import GenerateConfig, Generation, GenerationReport
    from polar.sft.journal import JournalError
    from polar.sft.service import local_service

    loaded = load_selected("generate", tasks, task_id)
    try:
        settings = GenerateConfig(
            out=out,
            harness=HarnessSpec(
                name=harness, options=dict(parse_option("generate", o) for o in option or [])
            ),
            attempts=attempts,
            accept=accept,
            session_timeout_s=timeout,
            max_in_flight=max_in_flight,
            dedupe=dedupe,
            keep_side_calls=keep_side_calls,
            max_tokens=max_tokens,
            per_task_cap=per_task_cap,
            formats=tuple(fmt or ("jsonl", "parquet")),
        )
    except ValidationError as exc:
        errors = exc.errors()
        if errors and isinstance(errors[0].get("ctx", {}).get("error"), AcceptError):
            fail("generate", str(errors[0]["ctx"]["error"]))
        fail("generate", describe_error(exc))
    configure_logging(log_level)
    display = _Display(len(loaded) * attempts)

    service = None
    if server_url is None:
        service = _service_config(config, engine_url, engine_kind, engine_model)
    try:
        # The journal is opened (and a mismatched rerun refused) before any service starts.
        with (
            Generation(
                settings,
                loaded,
                reattach=service is None,
                server=server_url or "local",
                on_progress=display,
            ) as generation,
            display,
        ):
            if service is None:
                assert server_url is not None
                with RolloutClient(server_url, token=token) as client:
                    report: GenerationReport = generation.run(client)
            else:
                with (
                    local_service(service.server, service.node, out / "service") as address,
                    RolloutClient(address.url, token=address.token) as client,
                ):
                    report = generation.run(client)
    except (JournalError, ConfigError) as exc:
        fail("generate", str(exc))
    except RolloutError as exc:
        fail("generate", str(exc), code=1)
    except OSError as exc:
        fail("generate", f"{exc.strerror or exc}", code=1)
    _print_report(report, out)
    if report.interrupted:
        raise typer.Exit(130)


def _service_config(
    config: Path | None, engine_url: str | None, engine_kind: str | None, model: str | None
) -> ServeConfig:
    from polar.configfile import merge

    data = merge(read_config("generate", config), {"server": {}, "node": {}})
    for section in ("server", "node"):
        if not isinstance(data.get(section), dict):
            fail("generate", f"{config}: {section} must be a mapping")
    node: dict[str, Any] = data["node"]
    node_defaults(node, None, engine_url, engine_kind, model)
    # The service lives in this process: a control token of its own unless given.
    token = data["server"].get("control_token") or node.get("control_token")
    token = token or secrets.token_urlsafe(32)
    data["server"].setdefault("control_token", token)
    node.setdefault("control_token", token)
    if "engine" not in node.get("gateway", {}):
        fail("generate", "no engine: give --engine-url and --engine-model, or --config")
    node.setdefault("server_url", "http://127.0.0.1:0")  # the local server's, once it listens
    return validate_config("generate", ServeConfig, data)


class _Display:
    """Live progress: a rich bar on a terminal, a line every 10 s otherwise."""

    def __init__(self, total: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self.tty = sys.stderr.isatty()
        self.progress = Progress(
            TextColumn("generate"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[state]}"),
            disable=not self.tty,
        )
        self.bar = self.progress.add_task("generate", total=total, state="starting")
        self.total = total
        self.shown = 0.0

    def __enter__(self) -> _Display:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(None, None, None)

    def __call__(self, stats: Any) -> None:
        from polar.sft.stats import progress_line

        overall = stats.overall
        line = progress_line(overall)
        self.progress.update(self.bar, completed=overall.attempts, state=line)
        now = time.monotonic()
        if not self.tty and (now - self.shown >= 10 or overall.attempts == self.total):
            self.shown = now
            print(f"generate: {overall.attempts}/{self.total} {line}", file=sys.stderr)


def _print_report(report: Any, out: Path) -> None:
    from rich.console import Console

    from polar.sft.stats import stats_table

    console = Console()
    if not console.is_terminal:  # a log: the table at its natural width, never wrapped
        console = Console(width=200)
    console.print(stats_table(report.stats))
    for name, rows in report.exports.rows.items():
        console.print(f"{out / name}: {rows} rows")
    if report.exports.chat_skipped:
        console.print(
            f"{len(report.exports.chat_skipped)} traces have no chat row (see {out / 'stats.json'})"
        )
    console.print(f"statistics: {out / 'stats.json'}; attempts: {out / 'attempts.jsonl'}")
    if report.interrupted:
        console.print("interrupted: rerun the same command to continue")


def sft(
    data: Annotated[
        Path, typer.Argument(help="Token export (tokens.parquet/.jsonl) or polar generate's dir.")
    ],
    model: Annotated[Path, typer.Option(help="Hugging Face model directory to start from.")],
    out: Annotated[Path, typer.Option(help="Where the fine-tuned model goes.")],
    epochs: Annotated[int, typer.Option(help="Passes over the data.")] = 1,
    max_steps: Annotated[int | None, typer.Option(help="Stop after this many steps.")] = None,
    batch_size: Annotated[int, typer.Option(help="Rows per optimizer step.")] = 8,
    micro_batch_size: Annotated[
        int | None, typer.Option(help="Rows per forward pass (gradients accumulate).")
    ] = None,
    lr: Annotated[float, typer.Option("--lr", help="Learning rate.")] = 1e-5,
    weight_decay: Annotated[float, typer.Option(help="AdamW weight decay.")] = 0.0,
    warmup_steps: Annotated[int, typer.Option(help="Linear warm-up steps.")] = 0,
    max_grad_norm: Annotated[float, typer.Option(help="Gradient norm clip (0: none).")] = 1.0,
    max_length: Annotated[int | None, typer.Option(help="Leave out rows longer than this.")] = None,
    seed: Annotated[int, typer.Option(help="Data order and initialisation seed.")] = 0,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")] = "auto",
    dtype: Annotated[
        str,
        typer.Option(help="Compute: auto, float32 or bfloat16 (weights stay float32)."),
    ] = "auto",
) -> None:
    """Supervised fine-tuning on a token export; loss per step in OUT/loss.jsonl."""
    from pydantic import ValidationError

    from polar.configfile import describe_error
    from polar.sft.train import FinetuneConfig, FinetuneError, finetune

    try:
        config = FinetuneConfig(
            data=data,
            model=model,
            out=out,
            epochs=epochs,
            max_steps=max_steps,
            batch_size=batch_size,
            micro_batch_size=micro_batch_size,
            learning_rate=lr,
            weight_decay=weight_decay,
            warmup_steps=warmup_steps,
            max_grad_norm=max_grad_norm or None,
            max_length=max_length,
            seed=seed,
            device=device,
            dtype=dtype,
        )
    except ValidationError as exc:
        fail("sft", describe_error(exc))
    try:
        report = finetune(config, progress=True)
    except FinetuneError as exc:
        fail("sft", str(exc))
    loss = (
        f"loss {report.first_loss:.4f} -> {report.last_loss:.4f}"
        if report.first_loss is not None and report.last_loss is not None
        else "no loss"
    )
    typer.echo(
        f"trained {report.steps} steps on {report.rows} rows ({report.tokens} labelled tokens) "
        f"on {report.device} ({report.precision} compute) in {report.seconds:.1f} s; {loss}"
    )
    if report.rows_too_long or report.rows_unlabelled:
        typer.echo(
            f"left out: {report.rows_too_long} rows too long, "
            f"{report.rows_unlabelled} without a labelled token"
        )
    typer.echo(f"model: {report.out}; loss log: {Path(report.out) / 'loss.jsonl'}")
