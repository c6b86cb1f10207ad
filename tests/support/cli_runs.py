"""One pinned agent CLI run through a gateway, with a logging proxy in between.

The proxy (:mod:`support.recorder`) keeps the exact bytes the CLI received, so
a test compares what the CLI *got* with what the recorded sampled ids decode
to, not what the gateway meant to send. Shared by the token-mode runs on the
embedded engine and the engine-rendered runs in front of real vLLM.

The taught model is a memoriser: it learnt each CLI's exchange on the prompts of
its rehearsal, and a prompt that differs from them (another workspace path or
date in the CLI's system prompt, read through the warm-up's frozen prefix) can
leave a second token in the nucleus. On CI, a freshly taught model answered
pi's first call with the exchange's last words, and no tool call, in six runs
out of six in other directories. So :func:`run_cli` first runs the CLI where the
build rehearsed it (:func:`polar.tinymodel.rehearsal.run_place` under
:data:`support.agents_model.REHEARSALS`, emptied): on the build's day its
prompts are the rehearsed ones, up to what its tool prints (a chunk or process
id, learnt in several variants).

Where that is not so (a model kept from another clone or day), the model may
draw a tool call its CLI cannot use: one the CLI does not offer (another CLI's
tool), or one that does not parse (it reaches the CLI as text, see
:mod:`polar.proxy.render.parse`), or no tool call at all. The CLI then runs
nothing and may give up. That is the model's draw, not the path under test, so
:func:`run_cli` runs the CLI again, up to :data:`RETRIES` times, each in a new
directory (so on another prompt), when a run that did not finish shows one of
those draws in its records; any other failure stands, and so does such a draw
on the last try.
What a malformed call delivers, per dialect, is tested exactly in
``tests/proxy/render/test_delivery.py``; here such a turn is only required to
be recorded as malformed.

The gateway enforces one sampling policy on every call, as a training run's node
gateway does (``rollout.sampling``): the tiny model's own defaults (Qwen3's),
at which it was taught (:func:`polar.tinymodel.rehearsal.teach_agents`). The Gemini
CLI asks for temperature 1, at which the memoriser, on prompts whose paths
differ from the rehearsed ones, kept a second token in the nucleus (on CI both
Gemini runs left the script on their first call); every call's record shows
the sampling it was drawn with.
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
from polar.ir import CompletionRecord, DeliveryIssue, PromptOrigin, RecordStatus, ToolCall
from polar.proxy.app import create_app
from polar.proxy.config import GatewayConfig
from polar.proxy.gateway import Gateway
from polar.proxy.store import SqliteStore
from polar.serverthread import ServerThread
from polar.tinymodel.rehearsal import INSTRUCTION, run_place
from polar.tinymodel.warmup import WarmupSpec

from support.agents_model import REHEARSALS
from support.recorder import Exchange, Recorder, received_turn

ADMIN = "0123456789abcdef0123"
_SPEC = WarmupSpec()
TAUGHT = {"temperature": _SPEC.temperature, "top_p": _SPEC.top_p, "top_k": _SPEC.top_k}
"""The tiny model's sampling defaults, enforced on every call."""
RETRIES = 2
"""Runs after the first when the model's draw was unusable (see the module's text)."""
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

    @property
    def finished(self) -> bool:
        """The CLI exited 0 with the task's file written."""
        proof = self.workdir / "proof.txt"
        return self.result.exit_code == 0 and proof.exists() and proof.read_text() == "polar\n"

    @property
    def unusable_draw(self) -> bool:
        """The model called a tool the CLI does not offer, or one that does not
        parse, or wrote no tool call in any call."""
        called = any(
            r.message is not None and any(isinstance(p, ToolCall) for p in r.message.parts)
            for r in self.records
        )
        return not called or any(
            r.malformed_tool_calls
            or any(f.issue is DeliveryIssue.TOOL_NOT_OFFERED for f in r.delivery_flags)
            for r in self.records
        )


def run_cli(
    name: str,
    gateway: dict[str, Any],
    root: Path,
    make_spec: Callable[..., RunSpec],
    harness_cache: Path,
) -> CliRun:
    """Run CLI ``name`` on the rehearsal's instruction through a gateway configured
    by ``gateway`` (admin token and store added), recording under ``root``: first
    where the CLI was rehearsed, then, up to :data:`RETRIES` times after an unusable
    draw of the model, in new directories (see the module's text)."""

    def once(where: Path, *, rehearsed: bool = False) -> CliRun:
        db = where / "records.db"
        config = GatewayConfig.model_validate(
            {
                **gateway,
                "admin_token": ADMIN,
                "store": {"path": str(db)},
                "sampling": {"policy": TAUGHT},
            }
        )
        with ServerThread(create_app(Gateway(config))) as server:
            recorder = Recorder(server.url)
            with ServerThread(recorder.app) as proxy:
                created = httpx.post(
                    f"{server.url}/admin/sessions",
                    headers={"authorization": f"Bearer {ADMIN}"},
                    json={"metadata": {"harness": name}},
                ).json()
                where_run: dict[str, Path] = {}
                if rehearsed:
                    where_run["workdir"], where_run["home"] = run_place(name, REHEARSALS)
                spec = make_spec(
                    gateway_url=proxy.url,
                    api_key=created["api_key"],
                    instruction=INSTRUCTION,
                    timeout_s=300.0,
                    **where_run,
                )
                ran = run_harness(load_harness(name), spec, cache_dir=harness_cache)
        store = SqliteStore(db)
        try:
            records = store.records(created["session_id"])
        finally:
            store.close()
        return CliRun(name, ran.result, records, recorder.posts(), spec.workdir)

    run = once(root, rehearsed=True)
    for again in range(1, RETRIES + 1):
        if run.finished or not run.unusable_draw:
            break
        print(f"{name}: the model drew a tool call the CLI cannot use; running it again ({again})")
        run = once(root / f"again{again}")
    return run


def decoded_turn(record: CompletionRecord, tokenizer: Any) -> tuple[str, list[tuple[str, Any]]]:
    """The sampled text (end-of-turn dropped) and the tool calls written in it."""
    text = tokenizer.decode(list(record.output_ids)).removesuffix("<|im_end|>")
    malformed = {m.raw for m in record.malformed_tool_calls}  # delivered as text
    calls = []
    for block in TOOL_CALL.finditer(text):
        if block.group(0) not in malformed:
            call = json.loads(block.group(1))
            calls.append((call["name"], call["arguments"]))
    return text, calls


def check_received(exchange: Exchange, record: CompletionRecord, tokenizer: Any) -> None:
    """What the CLI got is what the sampled ids say, nothing added or lost."""
    text, calls = decoded_turn(record, tokenizer)
    got = received_turn(exchange)
    reasoning, sep, answer = text.partition("</think>")
    if not sep:
        # The prompt opened the block and the model never closed it: all of it is
        # reasoning (see polar.proxy.render.parse), tool-call tags included.
        opened = tokenizer.decode(list(record.prompt_ids[-3:])).rstrip().endswith("<think>")
        assert opened, text
        calls, reasoning, answer = [], text, ""
    assert got.tool_calls == calls, (got, text)
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
        drawn = record.behaviour
        assert drawn is not None and drawn.sampling.temperature == TAUGHT["temperature"], drawn
        if not record.malformed_tool_calls:  # those: see the module's text
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
