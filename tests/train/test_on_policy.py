"""The trainer corrects against the distribution the engine actually sampled from.

Real parts only: the embedded engine (``polar engine serve``'s runner) serving
the default tiny model, whose ``generation_config.json`` ships Qwen3's
sampling defaults (temperature 0.6, top-p 0.95, top-k 20); the gateway in
token-in/token-out mode; multi-turn conversations through the OpenAI client;
the node's builder (``prefix_merge``); the trainer's batch, logprob and step
code. For the sampled tokens of each session the trainer's recomputed
logprobs must equal the logprobs it corrects against (the engine's, of the
distribution it drew from), and the truncated importance weights must be 1.

On the code before this change the engine reported the raw distribution's
logprobs and the trainer recomputed at temperature 1: both agreed (weights 1)
while the tokens came from temperature 0.6 and top-p 0.95, an uncorrected
off-policy gradient. The last check measures that gap on the same tokens.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from polar.distribution import Settings
from polar.ir import Distribution, EditKind, LogprobSource, RecordStatus
from polar.ir.behaviour import MODEL
from polar.proxy.engines.vllm_process import VllmProcess
from polar.train.batch import (
    Group,
    ScoredSession,
    advantages_of,
    microbatches,
    rows_of,
    unreproducible_tokens,
)
from polar.train.grpo import Aggregation, Baseline, MissingLogprob, mismatch, tis_weights
from polar.train.logprobs import token_logprobs
from polar.train.step import LossSettings, StepSettings, train_step
from polar.trajectory import BuildConfig, PrefixMerge, TurnFormat, samples_of

from support.paths import VLLM_PYTHON
from support.stack import Stack
from support.training import EmbeddedEngine

TOLERANCE = 1e-3
"""Largest |trainer - engine| logprob allowed on any sampled token (both float32 on
the same CPU; the engine decodes with a KV cache, the trainer in one pass)."""

QWEN3_DEFAULTS = Distribution(temperature=0.6, top_p=0.95, top_k=20)


def converse(stack: Stack, key: str, seed: int, **sampling: Any) -> None:
    """Two turns of a conversation, the harness asking for ``sampling``."""
    client = stack.openai(key)
    messages: list[Any] = [{"role": "user", "content": f"Write a poem about the number {seed}."}]
    for turn in range(2):
        reply = client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=24, seed=seed + turn, **sampling
        )
        messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
        messages.append({"role": "user", "content": "Again, shorter."})


@pytest.fixture(scope="module")
def model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model, shipping Qwen3's sampling defaults as Qwen3 checkpoints do."""
    copy = tmp_path_factory.mktemp("qwen3-defaults") / "tiny"
    shutil.copytree(tiny_model, copy)
    config = GenerationConfig.from_pretrained(str(copy))
    config.do_sample = True
    config.temperature, config.top_p, config.top_k = 0.6, 0.95, 20
    config.save_pretrained(str(copy))
    return copy


@pytest.fixture
def stack(make_stack: Any, model: Path) -> Iterator[Stack]:
    engine = EmbeddedEngine(model)
    stack: Stack = make_stack(
        {"turns": []},
        capture="token_in_token_out",
        engine_url=engine.url,
        engine={"kind": "embedded", "model": "tiny"},
        render={"tokenizer": str(model)},
    )
    yield stack
    engine.close()


def _session(stack: Stack, sampling: dict[str, Any] | None = None) -> tuple[str, str]:
    with stack.admin() as admin:
        reply = admin.post("/admin/sessions", json={"sampling": sampling} if sampling else {})
    reply.raise_for_status()
    return reply.json()["session_id"], reply.json()["api_key"]


def _group(stack: Stack, tokenizer: Any, sessions: list[str]) -> Group:
    builder = PrefixMerge(BuildConfig(turns=TurnFormat.from_tokenizer(tokenizer)))
    scored = []
    for i, sid in enumerate(sessions):
        samples = samples_of(builder.build(stack.records(sid)).with_reward(float(i)))
        scored.append(ScoredSession(sid, float(i), tuple(samples)))
    return Group("t", "t", "g", tuple(scored))


def test_the_trainer_recomputes_the_distribution_each_token_was_drawn_from(
    stack: Stack, tokenizer: Any, model: Path
) -> None:
    check_on_policy(stack, tokenizer, model)


@pytest.mark.vllm
@pytest.mark.slow
def test_the_same_against_vllm(
    make_stack: Any, tokenizer: Any, model: Path, tmp_path: Path
) -> None:
    """vLLM's CPU build, started as Polar starts it (processed logprobs), in front of it
    the gateway in token-in/token-out mode saying so."""
    if not VLLM_PYTHON.exists():
        pytest.fail(f"{VLLM_PYTHON} is missing: run scripts/setup --vllm (scripts/check does)")
    vllm = VllmProcess(
        VLLM_PYTHON,
        model,
        served_name="tiny",
        log_path=tmp_path / "vllm.log",
        base_env=dict(os.environ),
    )
    with vllm:
        stack: Stack = make_stack(
            {"turns": []},
            capture="token_in_token_out",
            engine_url=vllm.url,
            engine={"kind": "vllm", "model": "tiny", "logprobs": "processed"},
            render={"tokenizer": str(model)},
        )
        check_on_policy(stack, tokenizer, model)


def check_on_policy(stack: Stack, tokenizer: Any, model: Path) -> None:
    """Three sessions through ``stack`` (asked 0.6/0.95; asked nothing; a policy of
    temperature 1 over an ask of 0.6/0.95 and a penalty), then the trainer's checks."""
    asked_sid, asked_key = _session(stack)
    converse(stack, asked_key, 1, temperature=0.6, top_p=0.95)
    default_sid, default_key = _session(stack)
    converse(stack, default_key, 2)
    policy_sid, policy_key = _session(stack, {"temperature": 1.0})
    converse(stack, policy_key, 3, temperature=0.6, top_p=0.95, presence_penalty=0.5)

    # Every record says what it was drawn with.
    expected = {
        asked_sid: Distribution(temperature=0.6, top_p=0.95, top_k=20),  # top_k: the model's
        default_sid: QWEN3_DEFAULTS,
        policy_sid: MODEL,
    }
    for sid, dist in expected.items():
        records = stack.records(sid)
        assert len(records) == 2 and all(r.status is RecordStatus.COMPLETED for r in records)
        for r in records:
            assert r.behaviour is not None and r.behaviour.logprobs is LogprobSource.PROCESSED
            s = r.behaviour.sampling
            assert (s.temperature, s.top_p, s.top_k, s.min_p) == (
                dist.temperature,
                dist.top_p,
                dist.top_k,
                dist.min_p,
            )
    (record, _) = stack.records(policy_sid)
    (edit,) = [e for e in record.edits if e.kind is EditKind.ENFORCED_SAMPLING]
    assert "temperature 0.6" in edit.detail and "presence_penalty 0.5" in edit.detail
    assert record.behaviour is not None and record.behaviour.enforced

    group = _group(stack, tokenizer, [asked_sid, default_sid, policy_sid])
    for session, dist in zip(group.sessions, expected.values(), strict=True):
        assert [s.sampling for s in session.samples] == [dist]  # one clean trace each
    assert unreproducible_tokens([group]) == {}
    advantages = advantages_of([group], baseline=Baseline.MEAN, scale_by_std=False)
    rows = rows_of(
        [group],
        advantages,
        aggregation=Aggregation.TOKEN_MEAN,
        missing_logprob=MissingLogprob.TRUST,
    )
    policy = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32)
    policy.train(False)
    (mb,) = microbatches(rows, max_tokens=1 << 20, pad_id=0)
    with torch.no_grad():
        recomputed = token_logprobs(policy, mb)
    assert not recomputed.outside.any()
    gap = mismatch(recomputed.values, mb.rollout_logprobs, mb.rollout_mask)
    print(
        f"on-policy gap over {gap.tokens} tokens: mean |d| {gap.mean_abs:.2e}, "
        f"max |d| {gap.max_abs:.2e}, KL {gap.kl:.2e}"
    )
    assert gap.tokens == sum(len(r.output_ids) for s in expected for r in stack.records(s))
    assert gap.max_abs < TOLERANCE and abs(gap.kl) < TOLERANCE**2
    weights = tis_weights(recomputed.values, mb.rollout_logprobs, mb.rollout_mask, cap=2.0)
    assert torch.allclose(weights, torch.ones_like(weights), atol=2 * TOLERANCE)

    # The same through a real optimizer step: the step's own on-policy statistics.
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-6)
    metrics = train_step(
        policy,
        optimizer,
        rows,
        loss=LossSettings(),
        settings=StepSettings(micro_batch_tokens=1 << 20),
        policy_version=0,
    )
    assert metrics["mismatch_onpolicy/tokens"] == gap.tokens
    assert metrics["mismatch_onpolicy/max_abs"] < TOLERANCE
    assert abs(metrics["tis/mean"] - 1) < TOLERANCE
    assert metrics["trainer/outside_support_tokens"] == 0

    # What the old trainer did: temperature 1 over the whole vocabulary, for tokens
    # drawn at temperature 0.6 and top-p 0.95. Far off, and invisible to its metrics.
    (tempered,) = microbatches(
        [r for r in rows if r.sampling != MODEL], max_tokens=1 << 20, pad_id=0
    )
    as_before = dataclasses.replace(tempered, sampling=Settings.of([MODEL] * len(tempered.targets)))
    with torch.no_grad():
        old = token_logprobs(policy, as_before).values
    before = mismatch(old, as_before.rollout_logprobs, as_before.rollout_mask)
    print(
        f"temperature-1 trainer against the sampled distribution: mean |d| "
        f"{before.mean_abs:.3f}, KL {before.kl:.3f} over {before.tokens} tokens"
    )
    assert before.tokens > 0 and before.mean_abs > 100 * TOLERANCE and math.isfinite(before.kl)
