"""One pinned agent CLI run through a gateway, with a logging proxy in between.

The proxy (:mod:`support.recorder`) keeps the exact bytes the CLI received, so
a test compares what the CLI *got* with what the recorded sampled ids decode
to, not what the gateway meant to send. Shared by the token-mode runs on the
embedded engine and the engine-rendered runs in front of real vLLM.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from polar.harness import RunSpec, load_harness, run_harness
from polar.harness.process import ProcessResult
from polar.ir import CompletionRecord, PromptOrigin, RecordStatus
from polar.proxy.app import create_app
from polar.proxy.config import GatewayConfig
from polar.proxy.gateway import Gateway
from polar.proxy.store import SqliteStore
from polar.testing.serverthread import ServerThread
from polar.train.rehearsal import INSTRUCTION

from support.recorder import Exchange, Recorder, received_turn

ADMIN = "0123456789abcdef0123"
TOOL_CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)


@dataclass
class CliRun:
    name: str
    result: ProcessResult
    records: list[CompletionRecord]
    posts: list[Exchange]
    """The model calls the CLI made, with the bytes it received."""
    workdir: Path

    @property
    def detail(self) -> str:
        r = self.result
        return f"{self.name} exit {r.exit_code}\nstdout:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"


def run_cli(
    name: str,
    gateway: dict[str, Any],
    root: Path,
    make_spec: Callable[..., RunSpec],
    harness_cache: Path,
) -> CliRun:
    """Run CLI ``name`` on the rehearsal's instruction through a gateway configured
    by ``gateway`` (admin token and store added), recording under ``root``."""
    db = root / "records.db"
    config = GatewayConfig.model_validate(
        {**gateway, "admin_token": ADMIN, "store": {"path": str(db)}}
    )
    with ServerThread(create_app(Gateway(config))) as server:
        recorder = Recorder(server.url)
        with ServerThread(recorder.app) as proxy:
            created = httpx.post(
                f"{server.url}/admin/sessions",
                headers={"authorization": f"Bearer {ADMIN}"},
                json={"metadata": {"harness": name}},
            ).json()
            spec = make_spec(
                gateway_url=proxy.url,
                api_key=created["api_key"],
                instruction=INSTRUCTION,
                timeout_s=300.0,
            )
            run = run_harness(load_harness(name), spec, cache_dir=harness_cache)
    store = SqliteStore(db)
    try:
        records = store.records(created["session_id"])
    finally:
        store.close()
    return CliRun(name, run.result, records, recorder.posts(), spec.workdir)


def decoded_turn(record: CompletionRecord, tokenizer: Any) -> tuple[str, list[tuple[str, Any]]]:
    """The sampled text (end-of-turn dropped) and the tool calls written in it."""
    text = tokenizer.decode(list(record.output_ids)).removesuffix("<|im_end|>")
    calls = []
    for block in TOOL_CALL.findall(text):
        call = json.loads(block)
        calls.append((call["name"], call["arguments"]))
    return text, calls


def check_received(exchange: Exchange, record: CompletionRecord, tokenizer: Any) -> None:
    """What the CLI got is what the sampled ids say, nothing added or lost."""
    text, calls = decoded_turn(record, tokenizer)
    got = received_turn(exchange)
    assert got.tool_calls == calls, (got, text)
    reasoning, sep, answer = text.partition("</think>")
    assert sep, text
    assert got.reasoning.strip() == reasoning.removeprefix("<think>").strip(), (got, text)
    assert got.text.strip() == TOOL_CALL.sub("", answer).strip(), (got, text)


def check_delivered(run: CliRun, tokenizer: Any) -> None:
    """A multi-call run in which every call completed and every reply the CLI
    received is what that call's sampled ids decode to."""
    assert not run.result.timed_out, run.detail
    assert len(run.records) >= 2, run.detail
    assert len(run.posts) == len(run.records), (len(run.posts), len(run.records))
    for exchange, record in zip(run.posts, run.records, strict=True):
        assert record.status is RecordStatus.COMPLETED, record.error
        check_received(exchange, record, tokenizer)


def extending(records: list[CompletionRecord]) -> list[tuple[CompletionRecord, CompletionRecord]]:
    """(later call, the call whose prompt + sampled ids its prompt begins with),
    for every call the gateway found extending an earlier one of the session."""
    by_seq = {r.seq: r for r in records}
    out = []
    for later in records:
        lineage = later.lineage
        if lineage is None or lineage.origin is not PromptOrigin.EXTENDS:
            continue
        base = by_seq.get(lineage.base_seq) if lineage.base_seq is not None else None
        if base is not None:
            out.append((later, base))
    return out
