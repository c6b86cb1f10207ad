"""How far the trainer's logprobs are from the distribution a real CLI's tokens
were drawn from: as the trainer computed them before sampling behaviour was
recorded (temperature 1, the whole vocabulary), and as it computes them now
(each token under the settings the record says it was drawn with).

    .venv/bin/python benchmarks/on_policy.py [--harness codex] [--harness mini_swe_agent]

(CLIs that ask for a large output limit, Claude Code's 32k, sample for minutes
on this model's noise: leave them out here.)

Real parts: the pinned agent CLI (``scripts/setup --harnesses``) runs headless
against a gateway in token-in/token-out mode, which serves it from the embedded
engine; the model is the tiny one ``polar model init`` builds, with Qwen3's
published sampling defaults (temperature 0.6, top-p 0.95, top-k 20) in its
``generation_config.json`` as Qwen3 checkpoints ship them, which reach the
engine for every setting a CLI leaves unset. The tiny model's output is noise,
and each call is cut at ``--max-tokens``; what is measured is the
distribution, not the agent. The records are built with ``prefix_merge`` and
the trainer's own logprob code recomputes every sampled token.

Before, the engine reported the raw distribution's logprob and the trainer
recomputed at temperature 1: its mismatch metric compared those two and read
about 0, while the tokens had been drawn from the tempered, truncated
distribution. The ``before`` row is that hidden gap (the trainer's temperature-1
logprob against the logprob of the distribution sampled from); ``now`` is the
gap the trainer corrects against today.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

import httpx
import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from polar.distribution import Settings
from polar.harness import RunSpec
from polar.harness.registry import load_harness
from polar.harness.runner import run_harness
from polar.ir.behaviour import MODEL
from polar.proxy.app import create_app
from polar.proxy.config import GatewayConfig
from polar.proxy.engines.embedded import ModelRunner, create_engine_app
from polar.proxy.gateway import Gateway
from polar.proxy.store import SqliteStore
from polar.serverthread import ServerThread
from polar.tinymodel.build import build_tiny_model
from polar.tokenizer import load_tokenizer
from polar.train.batch import Group, ScoredSession, advantages_of, microbatches, rows_of
from polar.train.grpo import Aggregation, Baseline, Mismatch, MissingLogprob, mismatch
from polar.train.logprobs import token_logprobs
from polar.trajectory import BuildConfig, PrefixMerge, TurnFormat, samples_of

ADMIN = "benchmark-admin-token-0123456789"
INSTRUCTION = "Create a file named hello.txt that contains the word hello."


def qwen3_model(root: Path, base: Path | None) -> Path:
    """``base`` (default: the tiny model), shipping Qwen3's sampling defaults."""
    model = root / "model"
    if base is None:
        build_tiny_model(model)
    else:
        shutil.copytree(base, model)
    config = GenerationConfig.from_pretrained(str(model))
    config.do_sample = True
    config.temperature, config.top_p, config.top_k = 0.6, 0.95, 20
    config.save_pretrained(str(model))
    return model


def run(
    name: str, model: Path, root: Path, max_tokens: int, cache: Path
) -> tuple[Mismatch, Mismatch] | None:
    runner = ModelRunner(model, max_batch=2)
    try:
        with ServerThread(create_engine_app(runner, served_name="tiny")) as engine:
            config = GatewayConfig.model_validate(
                {
                    "admin_token": ADMIN,
                    "capture": "token_in_token_out",
                    "engine": {
                        "kind": "embedded",
                        "base_url": engine.url,
                        "model": "tiny",
                        "default_max_tokens": max_tokens,
                    },
                    "render": {"tokenizer": str(model)},
                    "store": {"path": str(root / "records.db")},
                }
            )
            with ServerThread(create_app(Gateway(config))) as gateway:
                created = httpx.post(
                    f"{gateway.url}/admin/sessions",
                    headers={"authorization": f"Bearer {ADMIN}"},
                    json={},
                ).json()
                (root / "work").mkdir()
                spec = RunSpec(
                    gateway_url=gateway.url,
                    api_key=created["api_key"],
                    model="tiny",
                    instruction=INSTRUCTION,
                    workdir=root / "work",
                    home=root / "home",
                    timeout_s=300.0,
                    path=os.environ.get("PATH", ""),
                )
                ran = run_harness(load_harness(name), spec, cache_dir=cache)
    finally:
        runner.close()
    store = SqliteStore(root / "records.db")
    try:
        records = store.records(created["session_id"])
    finally:
        store.close()
    if not records:
        print(f"{name}: exit {ran.result.exit_code}, no call reached the engine")
        return None
    tokenizer = load_tokenizer(model)
    trajectory = PrefixMerge(BuildConfig(turns=TurnFormat.from_tokenizer(tokenizer))).build(records)
    samples = samples_of(trajectory.with_reward(1.0))
    asked = sorted({str(r.original_request.get("temperature", "unset")) for r in records})
    sent = sorted({d.describe() for d in (s.sampling for s in samples) if hasattr(d, "describe")})
    print(
        f"{name}: exit {ran.result.exit_code}, {len(records)} call(s), harness asked "
        f"temperature {', '.join(asked)}; sampled with {'; '.join(sent) or '-'}"
    )
    group = Group("t", "t", "g", (ScoredSession("s", 1.0, tuple(samples)),))
    advantages = advantages_of([group], baseline=Baseline.MEAN, scale_by_std=False)
    rows = rows_of(
        [group],
        advantages,
        aggregation=Aggregation.TOKEN_MEAN,
        missing_logprob=MissingLogprob.TRUST,
    )
    if not rows:
        print(f"{name}: no trained tokens in the session (nothing to compare)")
        return None
    policy = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32)
    policy.train(False)
    (mb,) = microbatches(rows, max_tokens=1 << 22, pad_id=0)
    before_mb = type(mb)(
        **{f: getattr(mb, f) for f in mb.__dataclass_fields__ if f != "sampling"},
        sampling=Settings.of([MODEL] * len(mb.targets)),
    )
    with torch.no_grad():
        now = token_logprobs(policy, mb).values
        before = token_logprobs(policy, before_mb).values
    return (
        mismatch(before, mb.rollout_logprobs, mb.rollout_mask),
        mismatch(now, mb.rollout_logprobs, mb.rollout_mask),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--harness", action="append", help="an installed pinned CLI (repeat)")
    parser.add_argument("--max-tokens", type=int, default=48, help="tokens sampled per call")
    parser.add_argument("--cache", type=Path, default=Path(".cache/harness"))
    parser.add_argument(
        "--model",
        type=Path,
        help="a model directory to serve (copied, given Qwen3's defaults; default: the tiny one)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    names = args.harness or ["codex", "mini_swe_agent"]
    root = Path(tempfile.mkdtemp(prefix="polar-on-policy-"))
    try:
        model = qwen3_model(root, args.model)
        rows = []
        for name in names:
            gaps = run(name, model, root / name, args.max_tokens, args.cache)
            if gaps is not None:
                rows.append((name, "before", gaps[0]))
                rows.append((name, "now", gaps[1]))
        head = f"{'CLI':<15} {'trainer':<8} {'tokens':>7} {'mean |d|':>10} {'max |d|':>10}"
        print(f"\n{head} {'KL':>10}")
        for name, label, gap in rows:
            print(
                f"{name:<15} {label:<8} {gap.tokens:>7} {gap.mean_abs:>10.3g} "
                f"{gap.max_abs:>10.3g} {gap.kl:>10.3g}"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
