"""``polar serve``, ``polar node``, ``polar submit``, ``polar status``, ``polar cancel``: the
rollout service.

The control token is never optional: ``polar serve`` without one generates it
and prints it once, on stderr, when it starts (``--check`` prints no secret);
``polar node`` must be given its server's.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import secrets
import sys
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn, TypeVar

import typer
from pydantic import BaseModel, ConfigDict

from polar.cli.errors import configure_logging, fail
from polar.cli.listen import Listen, check_ports
from polar.cli.options import (
    DEFAULT_SERVER,
    TOKEN_ENV,
    Check,
    ControlPort,
    ControlToken,
    EngineKind,
    EngineModel,
    EngineUrl,
    HarnessOptions,
    HarnessRef,
    LogLevel,
    ServerUrl,
    SessionTimeout,
    TaskIds,
    TaskSource,
)
from polar.configfile import ConfigError, load_config, merge, read_yaml
from polar.rollout.config import NodeConfig, ServerConfig
from polar.rollout.raynodes import RayConfig

M = TypeVar("M", bound=BaseModel)


class ServeConfig(BaseModel):
    """``polar serve``'s file: a ``server:`` and a ``node:`` section; with ``backend: ray``,
    the node section is the template of the ``ray:`` section's node actors."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    server: ServerConfig
    node: NodeConfig
    backend: Literal["local", "ray"] = "local"
    ray: RayConfig = RayConfig()


SECRETS: dict[str, Any] = {
    "control_token": True,
    "gateway": {"admin_token": True, "engine": {"api_key"}},
}
"""What ``--check`` leaves out of a node's config."""


def _shown(settings: BaseModel, exclude: Any) -> str:
    return settings.model_dump_json(indent=2, exclude=exclude)


def node_defaults(
    node: dict[str, Any],
    token: str | None,
    engine_url: str | None,
    engine_kind: str | None,
    engine_model: str | None = None,
) -> None:
    gateway = node.setdefault("gateway", {})
    gateway.setdefault("port", 8300)
    # The node opens gateway sessions through its Python API; the admin routes
    # still need a token, so a random one protects them unless one is given.
    gateway.setdefault("admin_token", secrets.token_urlsafe(24))
    if engine_url is not None:
        gateway.setdefault("engine", {})["base_url"] = engine_url
    if engine_model is not None:
        gateway.setdefault("engine", {})["model"] = engine_model
    if engine_kind is not None:
        gateway.setdefault("engine", {})["kind"] = engine_kind
    if token is not None:
        node["control_token"] = token


def _announce(command: str, token: str) -> None:
    """Print a generated control token, once."""
    typer.echo(
        f"polar {command}: control token (generated; give it to polar submit and polar "
        f"status as --token or {TOKEN_ENV}): {token}",
        err=True,
    )


def serve(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="YAML with server: and node: sections.")
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="Rollout server port.", show_default="8200")
    ] = None,
    node_port: Annotated[
        int | None, typer.Option(help="The node's gateway port.", show_default="8300")
    ] = None,
    node_control_port: ControlPort = None,
    engine_url: EngineUrl = None,
    engine_kind: EngineKind = None,
    engine_model: EngineModel = None,
    db: Annotated[Path | None, typer.Option(help="SQLite file of tasks and results.")] = None,
    token: ControlToken = None,
    backend: Annotated[
        str | None,
        typer.Option(help="local (the node in this process) or ray (node actors on a cluster)."),
    ] = None,
    ray_address: Annotated[
        str | None,
        typer.Option(help="Ray cluster to join with --backend ray.", show_default="auto"),
    ] = None,
    ray_nodes: Annotated[
        int | None, typer.Option(help="Node actors to place with --backend ray.", show_default="1")
    ] = None,
    log_level: LogLevel = "info",
    check: Check = False,
) -> None:
    """Run a rollout server and a gateway node in this process (one machine), or the server
    here and gateway nodes as Ray actors across a cluster (--backend ray)."""
    overrides: dict[str, Any] = {"server": {}, "node": {}}
    server: dict[str, Any] = overrides["server"]
    node: dict[str, Any] = overrides["node"]
    if port is not None:
        server["port"] = port
    if db is not None:
        server["db"] = str(db)
    if node_port is not None:
        node.setdefault("gateway", {})["port"] = node_port
    if node_control_port is not None:
        node["control_port"] = node_control_port
    if backend is not None:
        overrides["backend"] = backend
    for key, value in (("address", ray_address), ("nodes", ray_nodes)):
        if value is not None:
            overrides.setdefault("ray", {})[key] = value
    raw = read_config("serve", config)
    data = merge(raw, overrides)
    for section in ("server", "node"):
        data.setdefault(section, {})
        if not isinstance(data.get(section), dict):
            fail("serve", f"{config}: {section} must be a mapping")
    merged_node, server_section = data["node"], data["server"]
    configured = token or server_section.get("control_token") or merged_node.get("control_token")
    generated = None if configured else secrets.token_urlsafe(32)
    shared = configured or generated
    server_section.setdefault("control_token", shared)
    if token is not None:
        server_section["control_token"] = token
    node_defaults(merged_node, token, engine_url, engine_kind, engine_model)
    merged_node.setdefault("control_token", server_section["control_token"])
    merged_node.setdefault(
        "server_url",
        f"http://{server_section.get('host', '127.0.0.1')}:{server_section.get('port', 8200)}",
    )
    settings = validate_config("serve", ServeConfig, data)
    ray = settings.ray if settings.backend == "ray" else None
    if ray is not None and importlib.util.find_spec("ray") is None:
        fail("serve", "--backend ray needs Ray: pip install 'polar[ray]'")
    if ray is None:
        preflight("serve", settings.node, "node.", tokenizer=check)
    if check:
        typer.echo(_shown(settings, {"server": {"control_token": True}, "node": SECRETS}))
        return
    listens = [Listen(settings.server.host, settings.server.port, "--port or server.port")]
    if ray is None:
        listens += node_listens(
            settings.node,
            "--node-port or node.gateway.port",
            "--node-control-port or node.control_port",
        )
    check_ports("serve", *listens)
    _run("serve", settings.server, settings.node, log_level, ray=ray, generated=generated)


def node(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="Node YAML.")] = None,
    server_url: Annotated[
        str | None, typer.Option(help="Rollout server to join.", show_default=DEFAULT_SERVER)
    ] = None,
    node_id: Annotated[str | None, typer.Option(help="This node's id.")] = None,
    port: Annotated[int | None, typer.Option(help="Gateway port.", show_default="8300")] = None,
    control_port: ControlPort = None,
    public_url: Annotated[
        str | None, typer.Option(help="How the server reaches this node.")
    ] = None,
    engine_url: EngineUrl = None,
    engine_kind: EngineKind = None,
    engine_model: EngineModel = None,
    token: ControlToken = None,
    log_level: LogLevel = "info",
    check: Check = False,
) -> None:
    """Run a gateway node that joins a rollout server."""
    raw = read_config("node", config)
    for key, value in (
        ("server_url", server_url),
        ("node_id", node_id),
        ("public_url", public_url),
    ):
        if value is not None:
            raw[key] = value
    raw.setdefault("server_url", DEFAULT_SERVER)
    raw.setdefault("gateway", {})
    if port is not None:
        raw["gateway"]["port"] = port
    if control_port is not None:
        raw["control_port"] = control_port
    node_defaults(raw, token, engine_url, engine_kind, engine_model)
    if not raw.get("control_token"):
        fail("node", f"the rollout server's control token is needed (--token or {TOKEN_ENV})")
    settings = validate_config("node", NodeConfig, raw)
    preflight("node", settings, "", tokenizer=check)
    if check:
        typer.echo(_shown(settings, SECRETS))
        return
    check_ports(
        "node", *node_listens(settings, "--port or gateway.port", "--control-port or control_port")
    )
    _run("node", None, settings, log_level)


def preflight(command: str, node: NodeConfig, prefix: str, *, tokenizer: bool) -> None:
    """The checks a node runs as it starts, short of taking its ports and leases:
    its engine plug-in and its sandboxes' limits, and with ``tokenizer`` (for
    ``--check``: start-up loads it anyway) the gateway's ``render.tokenizer``.
    ``prefix``: where the node's section is in the file (``node.`` in serve's)."""
    from polar.proxy.call.capture import check_tokenizer
    from polar.proxy.engines.registry import check_engine
    from polar.rollout.node.service import check_node
    from polar.runtime.errors import UnsupportedSpec

    try:
        check_engine(node.gateway)
        if tokenizer:
            check_tokenizer(node.gateway)
        check_node(node)
    except ConfigError as exc:
        fail(command, f"{prefix}gateway.{exc}")
    except UnsupportedSpec as exc:
        fail(command, f"the node's sandboxes cannot be given their limits: {exc}")


def node_listens(node: NodeConfig, gateway_setting: str, control_setting: str) -> list[Listen]:
    """The node's two addresses: its gateway's and its API's."""
    return [
        Listen(node.gateway.host, node.gateway.port, gateway_setting),
        Listen(node.control_host, node.control_port, control_setting),
    ]


def read_config(command: str, path: Path | None) -> dict[str, Any]:
    try:
        return read_yaml(path) if path is not None else {}
    except ConfigError as exc:
        fail(command, str(exc))


def validate_config(command: str, model: type[M], data: dict[str, Any]) -> M:
    try:
        return load_config(model, None, data)
    except ConfigError as exc:
        fail(command, str(exc))


def _run(
    command: str,
    server: ServerConfig | None,
    node: NodeConfig | None,
    level: str,
    *,
    ray: RayConfig | None = None,
    generated: str | None = None,
) -> None:
    """Serve until interrupted. Once every server has started, one line says where they
    listen, and a ``generated`` control token is printed after it (the last line
    before the logs of work)."""
    from polar.malloctune import pin_mmap_threshold
    from polar.rollout.deploy import Listening
    from polar.rollout.deploy import serve as serve_both
    from polar.runtime.errors import UnsupportedSpec
    from polar.runtime.lease import LeaseHeld

    configure_logging(level)
    pin_mmap_threshold()

    def ready(where: Listening) -> None:
        parts = []
        if where.server_url is not None:
            parts.append(f"rollout server {where.server_url}")
        if where.gateway_url is not None:
            parts.append(
                f"node {where.node_id} (gateway {where.gateway_url}, API {where.node_url})"
            )
        if node is not None and server is None:
            parts.append(f"joining {node.server_url}")
        if ray is not None:
            parts.append(f"placing {ray.nodes} node(s) on Ray")
        typer.echo(f"polar {command}: ready: {', '.join(parts)}", err=True)
        if generated is not None:
            _announce(command, generated)

    try:
        asyncio.run(serve_both(server, node, level, ray=ray, on_ready=ready))
    except UnsupportedSpec as exc:
        fail(command, f"the node's sandboxes cannot be given their limits: {exc}")
    except LeaseHeld as exc:
        fail(command, str(exc))
    except ConfigError as exc:  # the gateway's, found as it is built
        fail(command, f"{'node.' if server is not None else ''}gateway.{exc}")
    except OSError as exc:
        fail(command, f"cannot listen: {exc.strerror or exc}")
    except KeyboardInterrupt:
        pass


# -------------------------------------------------------------------- clients


def _client(server: str, token: str | None) -> Any:
    from polar.rollout.client import RolloutClient

    return RolloutClient(server, token=token)


def submit(
    tasks: TaskSource,
    harness: HarnessRef,
    samples: Annotated[int, typer.Option(help="Sessions per task (one GRPO group).")] = 4,
    option: HarnessOptions = None,
    task_id: TaskIds = None,
    timeout: SessionTimeout = 1800,
    early_stop_at: Annotated[int | None, typer.Option(help="Stop at this many usable.")] = None,
    max_resamples: Annotated[int, typer.Option(help="Extra sessions to fill a group.")] = 0,
    builder: Annotated[str, typer.Option(help="prefix_merge or per_request.")] = "prefix_merge",
    server: ServerUrl = DEFAULT_SERVER,
    token: ControlToken = None,
    out: Annotated[
        Path | None, typer.Option(help="Write each task's result as a JSON line here.")
    ] = None,
    wait: Annotated[bool, typer.Option(help="Wait for the results, with progress.")] = True,
) -> None:
    """Submit tasks to a rollout server (each as one group), and follow them."""
    from pydantic import ValidationError

    from polar.harness import InvalidHarnessOptions, UnknownHarness, check_harness
    from polar.rollout.client import RolloutError
    from polar.rollout.protocol import HarnessSpec, TaskStatus, TaskSubmission

    options = dict(parse_option("submit", o) for o in option or [])
    try:  # as the server would (422), before anything is loaded or sent
        check_harness(harness, options)
    except UnknownHarness as exc:
        fail("submit", f"--harness: {exc}")
    except InvalidHarnessOptions as exc:
        fail("submit", f"--option: {exc}")
    loaded = load_selected("submit", tasks, task_id)
    try:
        submissions = [
            TaskSubmission(
                task=t,
                harness=HarnessSpec(name=harness, options=options),
                num_samples=samples,
                session_timeout_s=timeout,
                early_stop_at=early_stop_at,
                max_resamples=max_resamples,
                builder=builder,
            )
            for t in loaded
        ]
    except ValidationError as exc:
        from polar.configfile import describe_error

        fail("submit", describe_error(exc))
    with _client(server, token) as client:
        views: list[Any] = []
        try:
            for submission in submissions:
                views.append(client.submit(submission))
        except RolloutError as exc:
            fail("submit", str(exc))
        except KeyboardInterrupt:
            _interrupted([v.task_id for v in views], server)
        for view in views:
            typer.echo(f"submitted {view.task_id} ({view.task}, {view.num_samples} sessions)")
        if not wait:
            return
        try:
            results = _follow(client, [v.task_id for v in views])
        except RolloutError as exc:
            fail("submit", str(exc))
        except KeyboardInterrupt:
            _interrupted([v.task_id for v in views], server)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("a", encoding="utf-8") as f:
            for result in results:
                f.write(result.model_dump_json() + "\n")
    for result in results:
        rewards = [r.reward for r in result.results]
        mean = "-" if result.mean_reward is None else f"{result.mean_reward:.3f}"
        typer.echo(
            f"{result.task_id} {result.task}: {result.status.value}, usable {result.usable}/"
            f"{len(result.results)}, mean reward {mean}, rewards {rewards}"
        )
    failed = [r for r in results if r.status is TaskStatus.FAILED]
    if failed:
        fail(
            "submit", f"{len(failed)} of {len(results)} tasks failed: no session completed", code=1
        )


def _interrupted(task_ids: list[str], server: str) -> NoReturn:
    """Ctrl-C: say that the submitted tasks go on, and how to follow or cancel them."""
    where = "" if server == DEFAULT_SERVER else f" --server {server}"
    if not task_ids:
        print("polar submit: interrupted; no task was submitted", file=sys.stderr)
    else:
        ids = " ".join(task_ids)
        print(
            f"polar submit: interrupted; the submitted tasks go on running on the server: "
            f"{ids}\n  follow them with: polar status{where} TASK\n"
            f"  cancel them with: polar cancel{where} {ids}",
            file=sys.stderr,
        )
    raise typer.Exit(130)


def cancel(
    task_ids: Annotated[list[str], typer.Argument(help="Task ids (as polar submit printed).")],
    server: ServerUrl = DEFAULT_SERVER,
    token: ControlToken = None,
) -> None:
    """Cancel tasks: their queued sessions never start, running ones are stopped (their
    sandboxes killed); results already in are kept."""
    from polar.rollout.client import RolloutError
    from polar.rollout.protocol import TaskStatus

    failed = False
    with _client(server, token) as client:
        for task_id in task_ids:
            try:
                view = client.cancel(task_id)
            except RolloutError as exc:
                if exc.status in (0, 401):  # no server, or not ours: the rest fail alike
                    fail("cancel", str(exc))
                print(f"polar cancel: error: {exc}", file=sys.stderr)
                failed = True
                continue
            counts = ", ".join(f"{k} {v}" for k, v in sorted(view.counts.items()))
            note = (
                "cancel requested; its running sessions are being stopped"
                if view.status is TaskStatus.RUNNING
                else f"{view.status.value}"
            )
            typer.echo(f"{view.task_id} {view.task}: {note} ({counts})")
    if failed:
        raise typer.Exit(1)


def load_selected(command: str, source: str, only: list[str] | None) -> list[Any]:
    """The tasks of ``source`` (only those named in ``only``, if given); one-line errors."""
    from polar.tasks import load_tasks
    from polar.tasks.errors import TaskError

    try:
        loaded = load_tasks(source)
    except TaskError as exc:
        fail(command, str(exc))
    if only:
        unknown = sorted(set(only) - {t.id for t in loaded})
        if unknown:
            fail(command, f"no task {unknown[0]} in {source}")
        loaded = [t for t in loaded if t.id in set(only)]
    return loaded


def parse_option(command: str, text: str) -> tuple[str, Any]:
    """A harness option ``KEY=VALUE`` (the value as JSON when it parses)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        fail(command, f"--option wants KEY=VALUE, not {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def _follow(client: Any, task_ids: list[str]) -> list[Any]:
    """Progress bars (one per task, advanced by the event stream) until all finish."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from polar.rollout.protocol import EventKind, TaskResult, TaskStatus

    pending = set(task_ids)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[state]}"),
        disable=not sys.stderr.isatty(),
    ) as progress:
        bars = {}
        for tid in task_ids:
            view = client.task(tid)
            bars[tid] = progress.add_task(view.task, total=view.num_samples, state="queued")
        for kind, data in client.events():
            tid = data.get("task_id")
            if tid not in bars:
                continue
            if kind in (EventKind.SESSION_STATUS, EventKind.SESSION_RESULT):
                view = client.task(tid)
                done = sum(1 for s in view.sessions if s.status.terminal)
                states = ", ".join(f"{k} {v}" for k, v in sorted(view.counts.items()))
                progress.update(bars[tid], completed=done, total=len(view.sessions), state=states)
            if kind is EventKind.TASK_FINISHED:
                pending.discard(tid)
                progress.update(bars[tid], state=str(data.get("status")))
            if not pending:
                break
            # a task that finished before the stream opened
            if kind is not EventKind.TASK_FINISHED:
                for other in list(pending):
                    if client.task(other).status is not TaskStatus.RUNNING:
                        pending.discard(other)
                if not pending:
                    break
    results = [client.result(tid) for tid in task_ids]
    return [r for r in results if isinstance(r, TaskResult)]


def status(
    task: Annotated[
        str | None, typer.Argument(help="A task id.", show_default="recent tasks")
    ] = None,
    server: ServerUrl = DEFAULT_SERVER,
    token: ControlToken = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show tasks (or one task's sessions) and the nodes of a rollout server."""
    from polar.rollout.client import RolloutError

    with _client(server, token) as client:
        try:
            if task is not None:
                view = client.task(task)
                if as_json:
                    typer.echo(view.model_dump_json(indent=2))
                    return
                typer.echo(f"{view.task_id} {view.task} [{view.status.value}] {view.harness}")
                for session in view.sessions:
                    reward = "-" if session.reward is None else f"{session.reward:g}"
                    extra = f"  ({session.error})" if session.error else ""
                    typer.echo(
                        f"  {session.session_id} {session.status.value:<10} reward {reward:<5} "
                        f"node {session.node_id or '-'}{extra}"
                    )
                return
            views = client.tasks()
            nodes = client.nodes()
        except RolloutError as exc:
            fail("status", str(exc))
    if as_json:
        typer.echo(
            json.dumps({"tasks": [v.model_dump(mode="json") for v in views], "nodes": nodes})
        )
        return
    typer.echo(f"nodes: {len(nodes)}")
    for node in nodes:
        health = "healthy" if node["healthy"] else "unhealthy"
        if node.get("engine_error"):
            health += f" ({node['engine_error']})"
        drain = ", draining" if node["draining"] else ""
        typer.echo(f"  {node['node_id']} {node['url']} {health}{drain}, {node['active']} sessions")
    typer.echo(f"tasks: {len(views)}")
    for view in views:
        mean = "-" if view.mean_reward is None else f"{view.mean_reward:.3f}"
        counts = ", ".join(f"{status} {n}" for status, n in sorted(view.counts.items()))
        typer.echo(
            f"  {view.task_id} {view.task} [{view.status.value}] {counts}; mean reward {mean}"
        )
