"""The embedded CPU engine: sampling, batching, logprobs, its HTTP API, weight swaps.

A real (tiny, randomly initialised) Qwen3-architecture model on torch; logprobs
are checked against a teacher-forced forward pass of the same weights.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from polar.proxy.engines.embedded import (
    Job,
    ModelRunner,
    SamplingParams,
    Step,
    create_engine_app,
    sample,
)
from polar.proxy.engines.embedded.runner import sample_rows
from polar.serverthread import ServerThread
from polar.tinymodel.build import TinyModelSpec, build_tiny_model

PROMPT = [151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture(scope="module")
def runner(model_dir: Path) -> Iterator[ModelRunner]:
    running = ModelRunner(model_dir, max_batch=4)
    yield running
    running.close()


@pytest.fixture(scope="module")
def engine(runner: ModelRunner) -> Iterator[str]:
    with ServerThread(create_engine_app(runner, served_name="tiny")) as server:
        yield server.url


def generate(runner: ModelRunner, prompt: list[int], params: SamplingParams) -> list[Step]:
    steps: list[Step] = []
    done = threading.Event()

    def emit(step: Step) -> None:
        steps.append(step)
        if step.finish is not None:
            done.set()

    runner.submit(Job(prompt=prompt, params=params, emit=emit))
    assert done.wait(60)
    return steps


def teacher_forced(runner: ModelRunner, prompt: list[int], output: list[int]) -> list[float]:
    with torch.inference_mode():
        logits = runner.model(input_ids=torch.tensor([prompt + output])).logits[0]
        logprobs = torch.log_softmax(logits.float(), dim=-1)
    start = len(prompt) - 1
    return [float(logprobs[start + i, token]) for i, token in enumerate(output)]


def test_sampling_rules() -> None:
    logits = torch.tensor([0.1, 2.0, 1.9, -1.0])
    greedy = SamplingParams(temperature=0)
    assert sample(logits, greedy, None)[0] == 1
    assert sample(logits, SamplingParams(top_k=1), torch.Generator().manual_seed(0))[0] == 1
    biased = SamplingParams(temperature=0, logit_bias=((3, 10.0),))
    token, logprob = sample(logits, biased, None)
    assert token == 3
    assert logprob == pytest.approx(
        float(torch.log_softmax(logits + torch.tensor([0, 0, 0, 10.0]), -1)[3])
    )
    seeded = [
        sample(logits, SamplingParams(seed=7), torch.Generator().manual_seed(7))[0]
        for _ in range(3)
    ]
    assert len(set(seeded)) == 1
    raw = sample(
        logits,
        SamplingParams(temperature=0.5, top_k=2),
        torch.Generator().manual_seed(1),
        mode="raw",
    )
    processed = sample(
        logits,
        SamplingParams(temperature=0.5, top_k=2),
        torch.Generator().manual_seed(1),
        mode="processed",
    )
    assert raw[0] == processed[0] and raw[1] < processed[1]


def test_a_batch_sampled_at_once_draws_what_each_row_draws_alone() -> None:
    """The GPU's sampler (one call for the batch) against the CPU's (row by row),
    here on the CPU: greedy rows, biased ones, seeded ones (from their own
    generators: the same tokens), and every row's logprob of its distribution."""
    torch.manual_seed(0)
    logits = torch.randn(5, 50)
    params = [
        SamplingParams(temperature=0),
        SamplingParams(temperature=0, logit_bias=((7, 30.0),)),
        SamplingParams(temperature=0.7, top_p=0.9, top_k=10, seed=11),
        SamplingParams(temperature=1.3, min_p=0.05, seed=12),
        SamplingParams(temperature=0.5, top_k=3),
    ]
    seeds = [p.seed for p in params]
    batch = sample_rows(
        logits.clone(),
        params,
        [torch.Generator().manual_seed(s) if s is not None else None for s in seeds],
    )
    alone = [
        sample(logits[row], p, torch.Generator().manual_seed(s) if s is not None else None)
        for row, (p, s) in enumerate(zip(params, seeds, strict=True))
    ]
    for row in (0, 1, 2, 3):
        assert batch[row][0] == alone[row][0]
        assert batch[row][1] == pytest.approx(alone[row][1], abs=1e-6)
    assert batch[1][0] == 7
    # the unseeded row: a token inside its top 3, with its logprob there
    token, logprob = batch[4]
    top3 = torch.topk(logits[4], 3).indices.tolist()
    assert token in top3
    kept = torch.log_softmax(logits[4, top3] / 0.5, dim=-1)
    assert logprob == pytest.approx(float(kept[top3.index(token)]), abs=1e-6)
    raw = sample_rows(logits.clone(), params, [None] * 5, mode="raw")
    assert raw[0][1] == pytest.approx(float(torch.log_softmax(logits[0], -1)[raw[0][0]]))


def _served_together(
    model_dir: Path, requests: list[SamplingParams], *, batched: bool
) -> list[list[tuple[int | None, float | None]]]:
    """Each request's (token, logprob) steps, all submitted at once to one engine."""
    engine = ModelRunner(model_dir, max_batch=4, batch_sampling=batched)
    steps: list[list[Step]] = [[] for _ in requests]
    done = threading.Semaphore(0)

    def emit(row: int, step: Step) -> None:
        steps[row].append(step)
        if step.finish is not None:
            done.release()

    try:
        assert engine.batch_sampling is batched
        engine.submit_many(
            [
                Job(prompt=PROMPT, params=p, emit=lambda s, r=row: emit(r, s))
                for row, p in enumerate(requests)
            ]
        )
        for _ in requests:
            assert done.acquire(timeout=60)
    finally:
        engine.close()
    return [[(s.token_id, s.logprob) for s in row] for row in steps]


def test_an_engine_sampling_batches_at_once_serves_what_one_sampling_rows_serves(
    model_dir: Path,
) -> None:
    """The GPU's way of sampling, run here on the CPU inside the engine: seeded and
    greedy requests batched together get the tokens and logprobs the CPU's way gives."""
    requests = [
        SamplingParams(max_tokens=8, seed=5),
        SamplingParams(max_tokens=8, temperature=0.7, top_p=0.9, seed=6),
        SamplingParams(max_tokens=8, temperature=0),
    ]
    one_by_one = _served_together(model_dir, requests, batched=False)
    at_once = _served_together(model_dir, requests, batched=True)
    for alone, together in zip(one_by_one, at_once, strict=True):
        assert [t for t, _ in together] == [t for t, _ in alone]
        assert [lp for _, lp in together] == pytest.approx([lp for _, lp in alone], abs=1e-5)


def test_logprobs_are_the_models_own(runner: ModelRunner) -> None:
    steps = generate(runner, PROMPT, SamplingParams(max_tokens=12, seed=3))
    ids = [s.token_id for s in steps if s.token_id is not None]
    got = [s.logprob for s in steps if s.logprob is not None]
    assert len(ids) == len(got) == 12 and steps[-1].finish == "length"
    assert got == pytest.approx(teacher_forced(runner, PROMPT, ids), abs=1e-4)  # type: ignore[arg-type]


def test_concurrent_requests_batch_and_match_single_runs(runner: ModelRunner) -> None:
    prompts = [
        PROMPT,
        PROMPT[:4],
        [151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, *PROMPT],
    ]
    params = SamplingParams(max_tokens=6, temperature=0)
    alone = [[s.token_id for s in generate(runner, p, params)] for p in prompts]
    together: list[list[Step]] = [[] for _ in prompts]
    done = [threading.Event() for _ in prompts]

    def emitter(i: int) -> Any:
        def emit(step: Step) -> None:
            together[i].append(step)
            if step.finish is not None:
                done[i].set()

        return emit

    # Submitted together: one batch of three prompts of different lengths (left-padded).
    runner.submit_many(
        [Job(prompt=p, params=params, emit=emitter(i)) for i, p in enumerate(prompts)]
    )
    assert all(event.wait(60) for event in done)
    assert [[s.token_id for s in steps] for steps in together] == alone


def test_a_chunked_prefill_samples_what_a_whole_one_does(model_dir: Path) -> None:
    """Prompts longer than the chunk, batched with a short one (left-padding spans
    chunks): the same greedy tokens and logprobs as one forward pass over each
    prompt alone; and the output projection only ever sees the last position."""
    long = [151644, 8948, 198, *range(1000, 1040), 151645, 198, *PROMPT]
    prompts = [long, PROMPT[:4], long[:23]]
    params = SamplingParams(max_tokens=5, temperature=0)
    chunked = ModelRunner(model_dir, max_batch=4, prefill_chunk=8)
    widths: list[int] = []
    hook = chunked.model.get_output_embeddings().register_forward_hook(
        lambda module, args, out: widths.append(args[0].shape[1])
    )
    try:
        together: list[list[Step]] = [[] for _ in prompts]
        done = [threading.Event() for _ in prompts]

        def emitter(i: int) -> Any:
            def emit(step: Step) -> None:
                together[i].append(step)
                if step.finish is not None:
                    done[i].set()

            return emit

        chunked.submit_many(
            [Job(prompt=p, params=params, emit=emitter(i)) for i, p in enumerate(prompts)]
        )
        assert all(event.wait(120) for event in done)
    finally:
        hook.remove()
        chunked.close()
    for prompt, steps in zip(prompts, together, strict=True):
        ids = [s.token_id for s in steps if s.token_id is not None]
        got = [s.logprob for s in steps if s.logprob is not None]
        assert len(ids) == 5
        assert got == pytest.approx(teacher_forced(chunked, prompt, ids), abs=1e-4)  # type: ignore[arg-type]
    assert widths and set(widths) == {1}


def test_memory_needed_counts_the_kv_cache_and_one_chunks_scores(model_dir: Path) -> None:
    runner = ModelRunner(model_dir, max_batch=2, prefill_chunk=64, max_memory_bytes=10 << 20)
    try:
        # Tiny model: 2 layers x 1 KV head x 32 dims x (K, V) x 4 bytes = 512 bytes a
        # position; 2 heads (+1 for the mask) x 4 bytes per score; 3 rows of 151,936 logits.
        logits = 3 * 151936 * 4
        assert runner.memory_needed(100, 28) == 128 * 512 + 64 * 100 * 3 * 4 + logits
        assert runner.memory_needed(10, 6, rows=2) == 2 * (16 * 512 + 10 * 10 * 3 * 4 + logits)
        assert runner.fits(100, 28)
        assert not runner.fits(20000, 100)  # 20000 x 64 x 12 bytes of scores alone: 14.6 MiB
    finally:
        runner.close()


def test_a_request_past_the_memory_limit_is_refused_not_run(model_dir: Path) -> None:
    runner = ModelRunner(model_dir, max_batch=2, prefill_chunk=64, max_memory_bytes=10 << 20)
    try:
        with ServerThread(create_engine_app(runner, served_name="tiny")) as server:
            body = {"model": "tiny", "prompt": [198] * 20000, "max_tokens": 100}
            reply = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
            assert reply.status_code == 400
            error = reply.json()["error"]
            assert (
                "needs about 26 MiB of engine memory (20000 prompt tokens, 100 to"
                in (error["message"])
            )
            assert "more than the embedded engine's limit of 10 MiB" in error["message"]
            assert error["param"] == "max_tokens"
            small = {"model": "tiny", "prompt": PROMPT, "max_tokens": 3}
            assert httpx.post(f"{server.url}/v1/completions", json=small, timeout=60).is_success
    finally:
        runner.close()


def test_stop_tokens_end_generation(runner: ModelRunner) -> None:
    stop = 1234
    steps = generate(
        runner,
        PROMPT,
        SamplingParams(max_tokens=20, logit_bias=((stop, 50.0),), stop_token_ids=frozenset({stop})),
    )
    assert [s.token_id for s in steps] == [stop]
    assert steps[0].finish == "stop"


def test_a_matched_stop_token_is_named_whole_and_streamed(engine: str) -> None:
    """vLLM names a stop token id that ended the turn in ``stop_reason`` (not an
    EOS), whole and on the finishing stream event: the gateway reads it there."""
    stop = 1234
    body = {
        "model": "tiny",
        "prompt": PROMPT,
        "max_tokens": 5,
        "seed": 3,
        "stop_token_ids": [stop],
        "logit_bias": {str(stop): 50.0},
        "return_token_ids": True,
    }
    choice = httpx.post(f"{engine}/v1/completions", json=body, timeout=60).json()["choices"][0]
    assert (choice["token_ids"], choice["finish_reason"], choice["stop_reason"]) == (
        [stop],
        "stop",
        stop,
    )
    with httpx.stream("POST", f"{engine}/v1/completions", json={**body, "stream": True}) as reply:
        lines = [line for line in reply.iter_lines() if line.startswith("data: {")]
    last = json.loads(lines[-1][6:])["choices"][0]
    assert (last["finish_reason"], last["stop_reason"]) == ("stop", stop)


def test_completions_api_speaks_vllms_token_in_format(engine: str, runner: ModelRunner) -> None:
    body = {
        "model": "tiny",
        "prompt": PROMPT,
        "max_tokens": 5,
        "seed": 11,
        "logprobs": 0,
        "return_token_ids": True,
    }
    reply = httpx.post(f"{engine}/v1/completions", json=body, timeout=60).json()
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 5
    assert choice["prompt_token_ids"] == PROMPT
    assert reply["usage"] == {
        "prompt_tokens": len(PROMPT),
        "total_tokens": len(PROMPT) + 5,
        "completion_tokens": 5,
    }
    with httpx.stream(
        "POST",
        f"{engine}/v1/completions",
        json={**body, "stream": True, "stream_options": {"include_usage": True}},
    ) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    streamed = [i for c in chunks for ch in c["choices"] for i in ch["token_ids"]]
    assert streamed == choice["token_ids"], "same seed, same tokens"
    assert chunks[0]["choices"][0]["prompt_token_ids"] == PROMPT
    assert chunks[-1]["usage"]["completion_tokens"] == 5
    lps = [x for c in chunks for ch in c["choices"] for x in ch["logprobs"]["token_logprobs"]]
    assert lps == choice["logprobs"]["token_logprobs"]


@pytest.mark.parametrize(
    ("patch", "status", "needle"),
    [
        ({"model": "other"}, 404, "does not exist"),
        ({"prompt": []}, 400, "prompt"),
        ({"prompt": [999999999]}, 400, "token ids must be in"),
        ({"max_tokens": 40000}, 400, "maximum context length"),
        ({"n": 2}, 400, "does not support: n"),
        ({"stop": ["\n"]}, 400, "stop (use stop_token_ids)"),
        ({"temperature": -1}, 400, "temperature"),
    ],
)
def test_bad_completion_requests_are_refused(
    engine: str, patch: dict[str, Any], status: int, needle: str
) -> None:
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 4, **patch}
    reply = httpx.post(f"{engine}/v1/completions", json=body, timeout=30)
    assert reply.status_code == status
    assert needle in reply.json()["error"]["message"]


def test_new_weights_load_in_place(tmp_path: Path, model_dir: Path) -> None:
    other = build_tiny_model(tmp_path / "other", TinyModelSpec(seed=1))
    runner = ModelRunner(model_dir, max_batch=2)
    try:
        with ServerThread(create_engine_app(runner, served_name="tiny")) as server:
            body = {
                "model": "tiny",
                "prompt": PROMPT,
                "max_tokens": 6,
                "temperature": 0,
                "logprobs": 0,
            }
            before = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()
            described = httpx.get(f"{server.url}/weights").json()
            assert described["weights_version"] == 0 and described["policy_version"] is None
            assert (described["device"], described["dtype"]) == ("cpu", "float32")
            loaded = httpx.post(
                f"{server.url}/weights", json={"path": str(other), "version": 5}, timeout=60
            )
            assert loaded.json()["weights_version"] == 1
            assert loaded.json()["policy_version"] == 5 and loaded.json()["adapter"] is None
            after = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()
            assert before["choices"][0]["token_ids"] != after["choices"][0]["token_ids"]
            bad = httpx.post(f"{server.url}/weights", json={"path": str(tmp_path / "nowhere")})
            assert bad.status_code == 400 and "no .safetensors" in bad.json()["error"]["message"]
            assert httpx.get(f"{server.url}/weights").json()["weights_version"] == 1
    finally:
        runner.close()


def test_gateway_records_what_the_embedded_engine_sampled(
    engine: str, runner: ModelRunner, tmp_path: Path, model_dir: Path
) -> None:
    from openai import OpenAI

    from polar.proxy.app import create_app
    from polar.proxy.config import GatewayConfig
    from polar.proxy.gateway import Gateway
    from polar.proxy.store import SqliteStore

    config = GatewayConfig.model_validate(
        {
            "admin_token": "0123456789abcdef0123",
            "capture": "token_in_token_out",
            "engine": {"kind": "embedded", "base_url": engine, "model": "tiny"},
            "render": {"tokenizer": str(model_dir)},
            "store": {"path": str(tmp_path / "r.db")},
        }
    )
    with ServerThread(create_app(Gateway(config))) as gateway:
        created = httpx.post(
            f"{gateway.url}/admin/sessions",
            headers={"authorization": "Bearer 0123456789abcdef0123"},
            json={},
        ).json()
        with OpenAI(
            base_url=f"{gateway.url}/v1", api_key=created["api_key"], max_retries=0
        ) as client:
            reply = client.chat.completions.create(
                model="policy",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=7,
                stream=True,
            )
            list(reply)
    (record,) = SqliteStore(tmp_path / "r.db").records(created["session_id"])
    assert record.engine == "embedded" and len(record.output_ids) == 7
    assert list(record.output_logprobs) == pytest.approx(
        teacher_forced(runner, list(record.prompt_ids), list(record.output_ids)), abs=1e-4
    )


def test_unset_sampling_fields_take_the_models_generation_config(
    tmp_path: Path, model_dir: Path, runner: ModelRunner
) -> None:
    """As vLLM with ``--generation-config auto``: a request that sets no temperature,
    top-p, top-k or min-p gets the model's own defaults; one that sets them wins."""
    import shutil

    from transformers import GenerationConfig

    from polar.proxy.engines.embedded.runner import default_sampling

    assert runner.default_sampling == SamplingParams()  # the tiny model sets none
    greedy_dir = tmp_path / "greedy"
    shutil.copytree(model_dir, greedy_dir)
    config = GenerationConfig.from_pretrained(str(model_dir))
    config.do_sample, config.temperature, config.top_k = True, 0.6, 1
    config.save_pretrained(str(greedy_dir))
    greedy = ModelRunner(greedy_dir, max_batch=1)
    try:
        assert greedy.default_sampling == SamplingParams(temperature=0.6, top_k=1)
        with ServerThread(create_engine_app(greedy, served_name="tiny")) as server:

            def tokens(**fields: Any) -> list[int]:
                body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 12, **fields}
                reply = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
                return list(reply.json()["choices"][0]["token_ids"])

            argmax = tokens(temperature=0)
            assert [tokens(seed=seed) for seed in (1, 2, 3)] == [argmax] * 3
            # top_k from the request (0: no limit) overrides the model's: samples vary
            assert (
                len({tuple(tokens(seed=seed, top_k=0, temperature=5.0)) for seed in (1, 2, 3)}) > 1
            )
    finally:
        greedy.close()
    assert default_sampling(None) == SamplingParams()
