"""Teach the tiny random model the tool-call format, in about a minute on a CPU.

A randomly initialised model never writes a ``<tool_call>``, so a demo of a
multi-turn tool exchange needs a model that does. This is a small supervised
fine-tune on synthetic dialogues (user asks for a file; the assistant reasons,
calls ``bash`` to write it; after the tool result it confirms), rendered with
the same chat template and splice rules the gateway uses, so the token
sequences are exactly those the gateway will send and sample. Loss is on the
assistant's tokens only.

Algorithm: next-token cross-entropy, AdamW, constant learning rate, whole
dialogues as examples (two assistant turns each). Deterministic given the seed.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

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
    learning_rate: float = 3e-3
    seed: int = 0


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


def masked_loss(model: Any, ids: Any, attention: Any, labels: Any) -> Any:
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


def is_warmed(out: Path, spec: WarmupSpec, base: Path) -> bool:
    marker = out / SPEC_FILE
    try:
        return bool(json.loads(marker.read_text()) == {**asdict(spec), "base": str(base)})
    except (OSError, ValueError):
        return False


def warm_up(base: Path, out: Path, spec: WarmupSpec = WarmupSpec()) -> dict[str, Any]:
    """Fine-tune the model in ``base`` into ``out``; returns a short report."""
    if is_warmed(out, spec, base):
        return {"kept": str(out)}
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(spec.seed)
    rng = random.Random(spec.seed)
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    template = ChatTemplate(tokenizer)
    data = examples(template)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate)
    losses = []
    for step in range(spec.steps):
        batch = rng.sample(data, 4)
        width = max(len(ids) for ids, _ in batch)
        # ids: [B, T]; labels: [B, T] with -100 where no loss
        ids = torch.full((len(batch), width), tokenizer.pad_token_id or 0, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for row, (seq, mask) in enumerate(batch):
            ids[row, : len(seq)] = torch.tensor(seq)
            attention[row, : len(seq)] = 1
            target = torch.tensor(seq)
            target[torch.tensor(mask) == 0] = -100
            labels[row, : len(seq)] = target
        loss = masked_loss(model, ids, attention, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        if step % 50 == 0 or step == spec.steps - 1:
            print(f"  warm-up step {step:>4}: loss {losses[-1]:.4f}", flush=True)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(base / name, tmp / name)
    (tmp / SPEC_FILE).write_text(json.dumps({**asdict(spec), "base": str(base)}) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return {"built": str(out), "first_loss": losses[0], "last_loss": losses[-1]}
