"""The scripted engine answers in vLLM's exact wire shape (compared with real captures)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar.testing.scripted import Script, ScriptedEngine

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"


def _shape(value: Any) -> Any:
    """Keys and value kinds, recursively (lists by their first element)."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    return type(value).__name__


def _chunks(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


@pytest.fixture
def engine(tokenizer: Any) -> Any:
    # The text real vLLM was forced to produce for the captured replies.
    raw = (
        '</think>\n\nSure.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}'
        "\n</tool_call><|im_end|>"
    )
    script = Script.from_dict({"turns": [{"raw": raw}, {"raw": raw}]})
    with ScriptedEngine(script, tokenizer, model="tiny") as running:
        yield running


def test_streamed_chunks_have_vllms_shape(engine: Any) -> None:
    request = json.loads((FIXTURES / "tool_stream.request.json").read_text())
    real = _chunks((FIXTURES / "tool_stream.sse").read_text())
    ours = _chunks(httpx.post(f"{engine.url}/v1/chat/completions", json=request).text)
    # first chunk, a plain token chunk, the tool-call chunk, the finishing chunk, the usage chunk
    assert _shape(ours[0]) == _shape(real[0])
    assert _shape(ours[2]) == _shape(real[2])
    named = lambda chunks: next(  # noqa: E731
        c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("tool_calls")
    )
    assert _shape(named(ours)) == _shape(named(real))
    finishing = lambda chunks: next(  # noqa: E731
        c for c in chunks if c["choices"] and c["choices"][0].get("finish_reason")
    )
    assert _shape(finishing(ours)) == _shape(finishing(real))
    assert finishing(ours)["choices"][0]["finish_reason"] == "tool_calls"
    assert _shape(ours[-1]) == _shape(real[-1])
    # The parsed call matches what real vLLM produced for the same text.
    args = "".join(
        call["function"].get("arguments", "")
        for c in ours
        for ch in c["choices"]
        for call in ch["delta"].get("tool_calls") or ()
    )
    assert json.loads(args) == {"command": "ls -la"}


def test_whole_reply_has_vllms_shape(engine: Any) -> None:
    request = json.loads((FIXTURES / "tool_nonstream.request.json").read_text())
    real = json.loads((FIXTURES / "tool_nonstream.json").read_text())
    ours = httpx.post(f"{engine.url}/v1/chat/completions", json=request).json()
    assert _shape(ours) == _shape(real)
    assert ours["choices"][0]["message"]["content"] == real["choices"][0]["message"]["content"]
    assert (
        ours["choices"][0]["message"]["tool_calls"][0]["function"]
        == (real["choices"][0]["message"]["tool_calls"][0]["function"])
    )


def test_prompt_ids_equal_real_vllms(engine: Any) -> None:
    """Same messages and tools: the scripted engine renders the prompt vLLM rendered."""
    request = json.loads((FIXTURES / "tool_nonstream.request.json").read_text())
    real = json.loads((FIXTURES / "tool_nonstream.json").read_text())
    tokenized = httpx.post(f"{engine.url}/tokenize", json=request).json()
    assert tokenized["tokens"] == real["prompt_token_ids"]


def test_running_out_of_script_fails_loudly(tokenizer: Any) -> None:
    with ScriptedEngine(Script.from_dict({"turns": []}), tokenizer) as engine:
        reply = httpx.post(
            f"{engine.url}/v1/chat/completions",
            json={"model": "scripted", "messages": [{"role": "user", "content": "x"}]},
        )
        assert reply.status_code == 500
        assert "only 0 turns" in reply.json()["error"]["message"]
        with pytest.raises(AssertionError, match="mismatches"):
            engine.assert_clean()
