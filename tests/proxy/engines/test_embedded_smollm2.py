"""The embedded engine serving the real pretrained model (SmolLM2-135M-Instruct,
Llama architecture) behind a token-in/token-out gateway: a chat answered with
sensible text, on the prompt the template renders, with the model's own logprobs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from openai import OpenAI

from polar.proxy.app import create_app
from polar.proxy.config import GatewayConfig
from polar.proxy.engines.embedded import ModelRunner, create_engine_app
from polar.proxy.gateway import Gateway
from polar.proxy.store import SqliteStore
from polar.serverthread import ServerThread

ADMIN = "0123456789abcdef0123"


@pytest.mark.slow
def test_smollm2_answers_a_chat_through_the_gateway(
    smollm2_dir: Path, smollm2_tokenizer: Any, tmp_path: Path
) -> None:
    runner = ModelRunner(smollm2_dir, max_batch=2)
    assert (runner.eos_ids, runner.pad_id, runner.max_model_len) == (frozenset({2}), 2, 8192)
    config = GatewayConfig.model_validate(
        {
            "admin_token": ADMIN,
            "capture": "token_in_token_out",
            "engine": {"kind": "embedded", "base_url": "http://127.0.0.1:9", "model": "smollm2"},
            "render": {"tokenizer": str(smollm2_dir), "reasoning": False},
            "store": {"path": str(tmp_path / "r.db")},
        }
    )
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    try:
        with ServerThread(create_engine_app(runner, served_name="smollm2")) as engine:
            config = config.model_copy(
                update={"engine": config.engine.model_copy(update={"base_url": engine.url})}
            )
            with ServerThread(create_app(Gateway(config))) as gateway:
                created = httpx.post(
                    f"{gateway.url}/admin/sessions",
                    headers={"authorization": f"Bearer {ADMIN}"},
                    json={},
                ).json()
                with OpenAI(
                    base_url=f"{gateway.url}/v1", api_key=created["api_key"], max_retries=0
                ) as client:
                    reply = client.chat.completions.create(
                        model="smollm2", messages=messages, max_tokens=12, temperature=0
                    )
        (record,) = SqliteStore(tmp_path / "r.db").records(created["session_id"])
        with torch.inference_mode():
            ids = list(record.prompt_ids + record.output_ids)
            logits = runner.model(input_ids=torch.tensor([ids])).logits[0]
            logprobs = torch.log_softmax(logits.float(), dim=-1)
    finally:
        runner.close()

    assert reply.choices[0].finish_reason == "stop"
    assert "Paris" in (reply.choices[0].message.content or "")
    assert list(record.prompt_ids) == list(
        smollm2_tokenizer.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=True, return_dict=False
        )
    )
    assert record.output_ids[-1] == 2  # <|im_end|> ended the turn
    start = len(record.prompt_ids) - 1
    teacher_forced = [float(logprobs[start + i, t]) for i, t in enumerate(record.output_ids)]
    assert list(record.output_logprobs) == pytest.approx(teacher_forced, abs=1e-4)
