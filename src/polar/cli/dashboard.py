"""``polar dashboard``: the web UI over a rollout server, record stores and training logs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from polar.cli.errors import fail
from polar.cli.listen import Listen, check_ports, serve_app
from polar.cli.options import DEFAULT_SERVER, TOKEN_ENV
from polar.configfile import describe_error


def dashboard(
    server: Annotated[
        str | None,
        typer.Option(help=f"Rollout server URL (e.g. {DEFAULT_SERVER}); none: records only."),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            envvar=TOKEN_ENV,
            help="The rollout server's control token; the dashboard asks browsers for it too. "
            "Without --server, on a loopback --host, it may be left out: no login then.",
        ),
    ] = None,
    store: Annotated[
        list[Path] | None,
        typer.Option(help="A gateway record store (SQLite) to read sessions from (repeatable)."),
    ] = None,
    metrics: Annotated[
        Path | None, typer.Option(help="The trainer's metrics.jsonl (or its run directory).")
    ] = None,
    sft: Annotated[
        Path | None, typer.Option(help="An SFT generation's stats.json (or its directory).")
    ] = None,
    tokenizer: Annotated[
        Path | None,
        typer.Option(help="Tokenizer directory of the served model.", show_default="bundled Qwen3"),
    ] = None,
    builder: Annotated[
        str, typer.Option(help="Trajectory builder for the token view (as the node's).")
    ] = "prefix_merge",
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8400,
) -> None:
    """Serve the dashboard: tasks and groups live, sessions, token views, training curves."""
    from polar.dashboard import DashboardConfig, create_dashboard_app
    from polar.loopback import is_loopback_host
    from polar.tokenizer import TokenizerLoadError, load_tokenizer
    from polar.trajectory import TrajectoryError, resolve_builder

    if token is None and server is not None:
        fail("dashboard", f"--server needs its control token: pass --token or set {TOKEN_ENV}")
    if token is None and not is_loopback_host(host):
        fail("dashboard", f"--host {host} needs a control token: pass --token or set {TOKEN_ENV}")
    for path in store or ():
        if not path.is_file():
            fail("dashboard", f"{path}: no record store there")
    try:
        config = DashboardConfig(
            control_token=token,
            server_url=server,
            stores=tuple(store or ()),
            metrics=metrics,
            sft=sft,
            builder=builder,
            host=host,
            port=port,
        )
        resolve_builder(builder)
    except ValidationError as exc:
        fail("dashboard", describe_error(exc))
    except TrajectoryError as exc:
        fail("dashboard", str(exc))
    if server is not None and not server.startswith(("http://", "https://")):
        fail("dashboard", "--server must start with http:// or https://")
    check_ports("dashboard", Listen(host, port, "--port"))  # before the tokenizer loads
    try:
        loaded = load_tokenizer(tokenizer)
    except TokenizerLoadError as exc:
        fail("dashboard", str(exc))
    if server is not None and token is not None:  # the config requires one with a server
        check_token(server, token)
    app = create_dashboard_app(config, loaded)
    serve_app("dashboard", app, host, port, "{url} (log in with the control token)")


def check_token(server: str, token: str) -> None:
    """Ask the rollout server whether it takes ``token``, and say what it answered: a
    refused token is a one-line error; a server that does not answer yet, a warning."""
    import httpx

    try:
        reply = httpx.get(
            f"{server.rstrip('/')}/nodes",
            headers={"authorization": f"Bearer {token}"},
            timeout=10,
        )
    except httpx.HTTPError as exc:
        typer.echo(
            f"polar dashboard: warning: rollout server {server} does not answer "
            f"({str(exc) or type(exc).__name__}); its tasks show once it does",
            err=True,
        )
        return
    if reply.status_code == 401:
        fail(
            "dashboard",
            f"rollout server {server} refuses this control token: give the one polar serve "
            f"uses (--token or {TOKEN_ENV})",
        )
    if reply.status_code != 200:
        typer.echo(
            f"polar dashboard: warning: rollout server {server} answered HTTP "
            f"{reply.status_code} to GET /nodes",
            err=True,
        )
        return
    typer.echo(f"polar dashboard: rollout server {server} takes the control token", err=True)
