"""Tools for chat templates that have no place for them.

Some chat templates render each message's role and content and nothing else
(SmolLM2's, :mod:`polar.smollm2`): the tools a request offers, the calls in
an assistant turn and what makes a tool turn a tool result would reach the
model as nothing. For such a template the gateway writes them into the
messages itself before the template renders them (``render.tool_prompt:
hermes``; ``auto``, the default, chooses it when the template renders a
conversation the same with tools as without), in the hermes format the
output parser reads (:mod:`polar.proxy.render.parse`), laid out as Qwen2.5's
template lays it out:

* **the tools**: a tool section at the end of the first message when it is a
  system message (after a blank line), else a system message of their own put
  first (the template's default system prompt, if it has one, then gives way)::

      # Tools

      You may call one or more functions to assist with the user query.

      You are provided with function signatures within <tools></tools> XML tags:
      <tools>
      {"type": "function", "function": {"name": ..., "description": ..., "parameters": ...}}
      </tools>

      For each function call, return a json object with function name and arguments
      within <tool_call></tool_call> XML tags:
      <tool_call>
      {"name": <function-name>, "arguments": <args-json-object>}
      </tool_call>

  (the sentence before ``<tool_call>`` is one line in the prompt), one tool
  a line, as JSON (the request's tools as vLLM hands them to
  templates, :func:`~polar.proxy.render.template.template_tools`);
* **an assistant turn's calls**: after its text (a newline between), each
  ``<tool_call>\\n{"name": "...", "arguments": {...}}\\n</tool_call>``, one
  newline between calls;
* **a tool result**: the tool turn's content as
  ``<tool_response>\\n...\\n</tool_response>`` (the turn keeps the role
  ``tool``: a ChatML template writes ``<|im_start|>tool``).

Each message becomes one message (the tools' own system message aside) and
depends on nothing but itself, so the text after an assistant turn is that of
the messages after it: renders stay append-only and the raw-token splice
(:mod:`polar.proxy.render.splice`) stays exact.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any


class ToolPrompt(StrEnum):
    """Who writes tools, tool calls and tool results into the prompt."""

    AUTO = "auto"
    """``hermes`` when the template renders a conversation alike with tools and
    without, else ``template``."""
    TEMPLATE = "template"
    """The chat template (it has a tool section)."""
    HERMES = "hermes"
    """The gateway, in the hermes format (this module), before the template renders."""


TOOLS_HEADER = (
    "# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>"
)
TOOLS_FOOTER = (
    "\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n"
    "<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>"
)


def tool_section(tools: Sequence[Mapping[str, Any]]) -> str:
    """The system turn's tool section for ``tools`` (template-shaped tool dicts)."""
    lines = "".join("\n" + json.dumps(tool, ensure_ascii=False) for tool in tools)
    return TOOLS_HEADER + lines + TOOLS_FOOTER


def tool_call_text(name: str, arguments: Any) -> str:
    """One call as the model is asked to write it."""
    call = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{call}\n</tool_call>"


def hermes_messages(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
) -> list[dict[str, Any]]:
    """``messages`` (template-shaped, :func:`~polar.proxy.render.template.template_message`)
    with the tools, calls and results written into their text, for a template
    that renders none of them; render the result without tools."""
    out = [_message(m) for m in messages]
    if tools:
        section = tool_section(tools)
        if out and out[0].get("role") == "system":
            content = out[0].get("content") or ""
            out[0] = {**out[0], "content": f"{content}\n\n{section}" if content else section}
        else:
            out.insert(0, {"role": "system", "content": section})
    return out


def _message(message: Mapping[str, Any]) -> dict[str, Any]:
    role = message.get("role")
    if role == "assistant" and message.get("tool_calls"):
        calls = [
            tool_call_text(call["function"]["name"], call["function"]["arguments"])
            for call in message["tool_calls"]
        ]
        text = message.get("content") or ""
        plain = {k: v for k, v in message.items() if k != "tool_calls"}
        return {**plain, "content": "\n".join([text, *calls] if text else calls)}
    if role == "tool":
        return {
            **message,
            "content": f"<tool_response>\n{message.get('content') or ''}\n</tool_response>",
        }
    return dict(message)
