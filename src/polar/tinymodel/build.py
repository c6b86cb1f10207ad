"""The default tiny model: a randomly initialised Qwen3-architecture causal LM
paired with the real Qwen3 tokenizer, built locally with no network.

About 9.8 M parameters (almost all of them the 151,936 x 64 embedding), small
enough to serve and train on one CPU, and real enough that every token-level
path (chat template, special tokens, byte-level BPE) is exercised exactly as
with a production Qwen3.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from polar.assets import QWEN3_TOKENIZER_DIR
from polar.atomicfile import atomic_directory

SPEC_FILE = "polar-model.json"
VOCAB_SIZE = 151936  # Qwen3's embedding rows (the tokenizer's 151,669 ids, padded)


@dataclass(frozen=True, slots=True)
class TinyModelSpec:
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    head_dim: int = 32
    max_position_embeddings: int = 32768
    seed: int = 0


def is_built(out: Path, spec: TinyModelSpec) -> bool:
    marker = out / SPEC_FILE
    if not marker.exists() or not (out / "model.safetensors").exists():
        return False
    try:
        return bool(json.loads(marker.read_text()) == asdict(spec))
    except (OSError, ValueError):
        return False


def build_tiny_model(
    out: Path,
    spec: TinyModelSpec = TinyModelSpec(),
    *,
    tokenizer_dir: Path = QWEN3_TOKENIZER_DIR,
    force: bool = False,
) -> Path:
    """Write the model to ``out`` (a Hugging Face model directory) and return it.

    Idempotent: an existing directory built from the same spec is left alone.
    """
    if not force and is_built(out, spec):
        return out
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(spec.seed)
    config = Qwen3Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=151643,
        eos_token_id=151645,
        pad_token_id=151643,
    )
    model = Qwen3ForCausalLM(config)
    with atomic_directory(out) as tmp:
        model.save_pretrained(tmp)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(tokenizer_dir / name, tmp / name)
        (tmp / SPEC_FILE).write_text(json.dumps(asdict(spec), indent=2) + "\n")
    return out
