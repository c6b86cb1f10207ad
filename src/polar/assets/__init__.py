"""Files Polar ships so it runs with no network.

``qwen3-tokenizer/`` is a byte-exact copy of the Qwen3 tokenizer (the
151,643-token byte-level BPE vocabulary, its 26 added tokens, and the Qwen3
thinking chat template). ``polar model init`` pairs it with a small, randomly
initialised Qwen3-architecture model to make the embedded default model.
"""

from pathlib import Path

ASSETS_DIR = Path(__file__).parent
QWEN3_TOKENIZER_DIR = ASSETS_DIR / "qwen3-tokenizer"
