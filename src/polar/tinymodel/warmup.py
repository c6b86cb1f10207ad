"""Teach the tiny random model the tool-call format, in about a minute on a CPU,
and optionally each agent CLI's own tool protocol on its own long prompts.

A randomly initialised model never writes a ``<tool_call>``, so a demo of a
multi-turn tool exchange needs a model that does. This is a small supervised
fine-tune on synthetic dialogues (user asks for a file; the assistant reasons,
calls ``bash`` to write it; after the tool result it confirms), rendered with
the same chat template and splice rules the gateway uses, so the token
sequences are exactly those the gateway will send and sample. Loss is on the
assistant's tokens only.

Rehearsed calls (:mod:`polar.tinymodel.rehearsal`: a real CLI's prompts, 1k-19k
tokens, and the outputs that CLI accepts) are learnt alongside. Backpropagating
through a 19k-token prompt on a CPU costs minutes per step, so these train with
a **frozen prefix**: the prompt's keys and values up to its last ``tail``
tokens are computed without gradients every ``refresh`` steps and reused in
between; gradients flow through the tail and the output. The staleness is
bounded: the step right after a refresh sees exact keys and values, and its
losses are the ones the stopping rule reads: every rehearsed output token is the
only one the sampling its call is drawn with can pick: the model's default
sampling (the taught model ships Qwen3's published defaults, temperature 0.6
and top-p 0.95, which vLLM and the embedded engine apply to a request that sets
none, as most CLIs' requests do, and which a gateway's ``sampling.policy``
enforces on the others), or a temperature and top-p given per call.

Algorithm: next-token cross-entropy, AdamW; synthetic dialogues: constant
learning rate, whole dialogues as examples (two assistant turns each);
rehearsed calls (which then replace the dialogues, as they teach the format
themselves): every call in every step, the learning rate decaying linearly to a
tenth over ``max_steps``. Deterministic given the seed.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from polar.atomicfile import atomic_directory
from polar.causallm import CausalLM, load_causal_lm
from polar.ir import Message, Role, TextPart, ToolCall, ToolSpec
from polar.proxy.render.template import ChatTemplate

SPEC_FILE = "polar-warmup.json"

BASH = ToolSpec(
    name="bash",
    description="Run a shell command in the workspace.",
    parameters={
        "type": "object",
        "properties": {"command": {"type": "string", "description": "The command."}},
        "required": ["command"],
    },
)
SYSTEM = "You are a coding agent. Use the bash tool to change files."
NAMES = ("hello.txt", "notes.md", "todo.txt", "out.txt", "greeting.txt", "data.csv")
TEXTS = ("hi", "hello world", "done", "42", "ok", "polar")
ASKS = (
    "Create a file named {name} that contains {text}.",
    "Write {text} into {name}.",
    "Please put {text} in a new file {name}.",
)


@dataclass(frozen=True, slots=True)
class WarmupSpec:
    steps: int = 150
    """Steps on the synthetic dialogues (without rehearsed calls)."""
    learning_rate: float = 3e-3
    seed: int = 0
    max_steps: int = 400
    """With rehearsed calls: train until they are learnt, up to this many steps
    (the learning rate decays linearly to a tenth over them)."""
    tail: int = 128
    """Prompt tokens of a rehearsed call trained through (the rest is a frozen prefix)."""
    refresh: int = 10
    """Steps between recomputations of the frozen prefixes."""
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 20
    """With rehearsed calls: the sampling defaults written into the taught model's
    generation config (Qwen3's published ones, which vLLM and the embedded engine
    apply to a request that sets none). Training stops once each rehearsed output
    token is the only one its call's sampling can pick: its probability at
    ``temperature`` is at least ``top_p`` (or at the temperature and top-p its CLI
    asks for, see :class:`LongExample`)."""


@dataclass(frozen=True, slots=True)
class LongExample:
    """A rehearsed call split for frozen-prefix training."""

    prefix: list[int]
    tail: list[int]
    """The prompt's last tokens, then the output."""
    outputs: int
    """How many of ``tail``'s last tokens are output (the ones with a loss)."""
    temperature: float | None = None
    top_p: float | None = None
    """The sampling its CLI asks for (None: the model's defaults, which the spec
    sets): the stopping rule holds each output token to it."""


def long_example(
    prompt: Sequence[int],
    output: Sequence[int],
    tail: int,
    *,
    temperature: float | None = None,
    top_p: float | None = None,
) -> LongExample:
    cut = max(1, len(prompt) - tail)
    return LongExample(
        list(prompt[:cut]), list(prompt[cut:]) + list(output), len(output), temperature, top_p
    )


def dialogue(name: str, text: str, ask: str) -> list[tuple[list[Message], str]]:
    """(conversation so far, the assistant output to learn) for each assistant turn."""
    user = Message(role=Role.USER, parts=(TextPart(ask.format(name=name, text=text)),))
    command = f"echo {text} > {name}"
    arguments = json.dumps({"command": command})
    first = (
        f"The user wants {name} with {text}.\n</think>\n\n"
        f'<tool_call>\n{{"name": "bash", "arguments": {arguments}}}\n</tool_call><|im_end|>'
    )
    call = ToolCall(id="call_1", name="bash", arguments=arguments)
    assistant = Message(role=Role.ASSISTANT, parts=(call,))
    result = Message(role=Role.TOOL, parts=(TextPart(""),), tool_call_id="call_1")
    second = f"The file is written.\n</think>\n\nDone: {name} contains {text}.<|im_end|>"
    system = Message(role=Role.SYSTEM, parts=(TextPart(SYSTEM),))
    return [([system, user], first), ([system, user, assistant, result], second)]


def examples(template: ChatTemplate) -> list[tuple[list[int], list[int]]]:
    """Token sequences and loss masks, built the way the gateway splices prompts."""
    out = []
    for name in NAMES:
        for text in TEXTS:
            for ask in ASKS:
                (first_msgs, first), (second_msgs, second) = dialogue(name, text, ask)
                prompt, _ = template.render(first_msgs, (BASH,), kwargs={})
                out1 = template.text.encode(first)
                tail, _ = template.continuation(second_msgs, (BASH,), 2, kwargs={})
                out2 = template.text.encode(second)
                ids = prompt + out1 + tail + out2
                mask = [0] * len(prompt) + [1] * len(out1) + [0] * len(tail) + [1] * len(out2)
                out.append((ids, mask))
    return out


def masked_loss(model: CausalLM, ids: Any, attention: Any, labels: Any) -> Any:
    """Mean next-token cross-entropy over labelled positions.

    The output projection (151,936 x hidden) dominates a tiny model's cost, so
    it is applied only where there is a label: the positions that predict an
    assistant token, not the whole prompt.
    """
    import torch

    hidden = model.get_decoder()(input_ids=ids, attention_mask=attention).last_hidden_state
    # hidden[:, t] predicts token t + 1: [B, T-1, H] against labels [B, T-1]
    targets = labels[:, 1:]
    keep = targets != -100
    logits = model.get_output_embeddings()(hidden[:, :-1][keep])  # [N, V]
    return torch.nn.functional.cross_entropy(logits.float(), targets[keep])


def is_warmed(
    out: Path, spec: WarmupSpec, base: Path, rehearsed: Mapping[str, str] | None = None
) -> bool:
    """``out`` was built from ``base`` with ``spec`` (and rehearsals of exactly these
    harnesses at these versions)."""
    marker = out / SPEC_FILE
    try:
        return bool(json.loads(marker.read_text()) == _marker(spec, base, rehearsed))
    except (OSError, ValueError):
        return False


def _marker(spec: WarmupSpec, base: Path, rehearsed: Mapping[str, str] | None) -> dict[str, Any]:
    mark: dict[str, Any] = {**asdict(spec), "base": str(base)}
    if rehearsed:
        mark["rehearsed"] = dict(sorted(rehearsed.items()))
    return mark


def _batch(
    data: list[tuple[list[int], list[int]]], rng: random.Random, pad: int
) -> tuple[Any, Any, Any]:
    """Four whole dialogues, right-padded: ids, attention mask, labels (-100: no loss)."""
    import torch

    batch = rng.sample(data, 4)
    width = max(len(ids) for ids, _ in batch)
    # ids: [B, T]; labels: [B, T] with -100 where no loss
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for row, (seq, mask) in enumerate(batch):
        ids[row, : len(seq)] = torch.tensor(seq)
        attention[row, : len(seq)] = 1
        target = torch.tensor(seq)
        target[torch.tensor(mask) == 0] = -100
        labels[row, : len(seq)] = target
    return ids, attention, labels


def frozen_prefixes(model: CausalLM, prefixes: Sequence[list[int]]) -> list[list[tuple[Any, Any]]]:
    """Each prefix's keys and values per layer, computed without gradients.

    A prefix that begins another one (a CLI's second prompt extends its first)
    takes a slice of the longer one's: causal attention makes them equal, and
    the longer pass is paid once."""
    import torch

    done: list[tuple[list[int], list[tuple[Any, Any]]]] = []
    out: dict[int, list[tuple[Any, Any]]] = {}
    for index in sorted(range(len(prefixes)), key=lambda i: -len(prefixes[i])):
        prefix = prefixes[index]
        longer = next((kv for seen, kv in done if seen[: len(prefix)] == prefix), None)
        if longer is None:
            with torch.no_grad():
                result = model(input_ids=torch.tensor([prefix]), use_cache=True, logits_to_keep=1)
            kv = [(layer.keys, layer.values) for layer in result.past_key_values.layers]
            done.append((prefix, kv))
        else:  # keys/values: [batch, kv heads, positions, head dim]
            kv = [(k[:, :, : len(prefix)], v[:, :, : len(prefix)]) for k, v in longer]
        out[index] = kv
    return [out[i] for i in range(len(prefixes))]


def tail_hidden(model: CausalLM, example: LongExample, kv: list[tuple[Any, Any]]) -> Any:
    """The decoder's states that predict the output tokens, the prompt read
    through ``kv``: [outputs, hidden]."""
    import torch
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    for layer, (keys, values) in enumerate(kv):
        cache.update(keys, values, layer)
    start = len(example.prefix)
    ids = torch.tensor([example.tail])  # [1, T]
    positions = torch.arange(start, start + len(example.tail)).unsqueeze(0)
    hidden = model.get_decoder()(
        input_ids=ids, past_key_values=cache, position_ids=positions, use_cache=True
    ).last_hidden_state
    # hidden[:, t] predicts tail[t + 1]; the outputs are the last `outputs` tokens
    return hidden[0, -example.outputs - 1 : -1]


def output_logprobs(
    model: CausalLM,
    long: Sequence[LongExample],
    kvs: Sequence[list[tuple[Any, Any]]],
    temperature: float = 1.0,
) -> tuple[list[Any], list[Any]]:
    """Each example's output-token log-probabilities, one tensor per example: of
    the model's distribution, and of that distribution at the example's own
    temperature (``temperature`` where it has none).

    The output projection (151,936 rows) is applied once to every example's
    states together: it is memory-bound, so one pass over its weights instead
    of one per example is most of a step's time saved."""
    import torch

    hidden = torch.cat([tail_hidden(model, e, kv) for e, kv in zip(long, kvs, strict=True)])
    targets = torch.tensor([t for e in long for t in e.tail[-e.outputs :]])[:, None]
    logits = model.get_output_embeddings()(hidden).float()  # [sum outputs, V]
    raw = torch.log_softmax(logits, -1).gather(1, targets)[:, 0]
    scale = torch.tensor([e.temperature or temperature for e in long for _ in range(e.outputs)])[
        :, None
    ]  # [sum outputs, 1]
    tempered = torch.log_softmax(logits.detach() / scale, -1).gather(1, targets)[:, 0]
    return _per_example(raw, long), _per_example(tempered, long)


def _per_example(values: Any, long: Sequence[LongExample]) -> list[Any]:
    out, start = [], 0
    for example in long:
        out.append(values[start : start + example.outputs])
        start += example.outputs
    return out


PROGRESS_EVERY_S = 30.0
"""The longest the warm-up goes without a progress line (a rehearsed step can take minutes)."""


def progress(elapsed_s: float, done: int, total: int, *, early_stop: bool) -> str:
    """``12 s, about 85 s left``: the time left at the mean pace of the steps so far
    (``at most`` when the loop may stop early, as with rehearsed calls)."""
    left = elapsed_s / done * (total - done)
    if done >= total:
        return f"{elapsed_s:.0f} s"
    return f"{elapsed_s:.0f} s, {'at most ' if early_stop else ''}about {left:.0f} s left"


def warm_up(
    base: Path,
    out: Path,
    spec: WarmupSpec = WarmupSpec(),
    *,
    rehearsed: Sequence[tuple[Sequence[int], Sequence[int]]] = (),
    rehearsed_from: Mapping[str, str] | None = None,
    sampled_at: Sequence[tuple[float | None, float | None]] = (),
) -> dict[str, Any]:
    """Fine-tune the model in ``base`` into ``out``; returns a short report.

    ``rehearsed``: (prompt ids, output ids) of calls to learn as well, e.g. from
    :func:`polar.tinymodel.rehearsal.rehearse`; ``rehearsed_from`` names where they
    came from (harness -> version) for the marker that makes a rebuild of the
    same thing a no-op; ``sampled_at``: the (temperature, top-p) each call's CLI
    asks for, in order (None, or none given: the spec's defaults).
    """
    if is_warmed(out, spec, base, rehearsed_from):
        return {"kept": str(out)}
    import torch

    from polar.tokenizer import load_tokenizer

    torch.manual_seed(spec.seed)
    rng = random.Random(spec.seed)
    tokenizer = load_tokenizer(base)
    asked = list(sampled_at) + [(None, None)] * (len(rehearsed) - len(sampled_at))
    long = [
        long_example(prompt, output, spec.tail, temperature=t, top_p=p)
        for (prompt, output), (t, p) in zip(rehearsed, asked, strict=True)
    ]
    # Rehearsed calls teach the format on their own; the synthetic dialogues only
    # when there are none (the demo's model).
    data = [] if long else examples(ChatTemplate(tokenizer))
    model = load_causal_lm(base, dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate)
    last = spec.max_steps if long else spec.steps
    # With rehearsed calls, a linear decay to a tenth: late steps settle instead of hopping.
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 1.0 - 0.9 * min(step, last) / last if long else 1.0
    )
    losses: list[float] = []
    worst = 0.0  # lowest tempered output-token probability of a rehearsed call, last refresh
    # Each call is learnt when its least likely output token, at its sampling's
    # temperature, is the whole top-p nucleus.
    needed = [e.top_p or spec.top_p for e in long]
    kvs: list[list[tuple[Any, Any]]] = []
    started = said = time.monotonic()
    for step in range(last):
        optimizer.zero_grad()
        if long:
            exact = step % spec.refresh == 0
            if exact:
                kvs = frozen_prefixes(model, [example.prefix for example in long])
            per_example, tempered = output_logprobs(model, long, kvs, spec.temperature)
            loss = sum(-lp.mean() for lp in per_example) / len(long)
            if exact:
                lowest = [math.exp(float(lp.min())) for lp in tempered]
                worst = min(lowest)
                if all(p >= q for p, q in zip(lowest, needed, strict=True)):
                    break
        else:
            exact = False
            ids, attention, labels = _batch(data, rng, tokenizer.pad_token_id or 0)
            loss = masked_loss(model, ids, attention, labels)
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
        now = time.monotonic()
        if step % 50 == 0 or step == last - 1 or exact or now - said >= PROGRESS_EVERY_S:
            said = now
            extra = f", rehearsed worst token p@T {worst:.3f}" if long else ""
            print(
                f"  warm-up step {step + 1:>4}/{last}: loss {losses[-1]:.4f}{extra} "
                f"({progress(now - started, step + 1, last, early_stop=bool(long))})",
                flush=True,
            )
    if long:
        with torch.no_grad():  # exact, whatever step the loop stopped at
            kvs = frozen_prefixes(model, [example.prefix for example in long])
            _, tempered = output_logprobs(model, long, kvs, spec.temperature)
            worst = math.exp(min(float(lp.min()) for lp in tempered))
    with atomic_directory(out) as tmp:
        model.save_pretrained(tmp)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(base / name, tmp / name)
        if long:
            sampling = model.generation_config
            sampling.do_sample = True
            sampling.temperature, sampling.top_p, sampling.top_k = (
                spec.temperature,
                spec.top_p,
                spec.top_k,
            )
            sampling.save_pretrained(tmp)
        (tmp / SPEC_FILE).write_text(json.dumps(_marker(spec, base, rehearsed_from)) + "\n")
    report: dict[str, Any] = {
        "built": str(out),
        "steps": len(losses),
        "first_loss": losses[0],
        "last_loss": losses[-1],
    }
    if long:
        report["rehearsed_calls"] = len(long)
        report["rehearsed_worst_token_prob_at_temperature"] = worst
    return report
