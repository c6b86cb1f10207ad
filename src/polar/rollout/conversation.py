"""A trace's conversation as OpenAI chat messages: what SFT exports keep next to
the tokens (asked for with ``TaskSubmission.conversations``).

A trace (one segment of a chain, see :mod:`polar.trajectory`) is a run of calls
whose prompts extend one another. Its conversation is the last call's request
(messages and tools, read back from what the harness sent, in its dialect) with
every assistant turn the model produced in the trace replaced by the message
the gateway returned for it, then the last call's reply. Harnesses replay
earlier turns in their own way (Qwen Code trims reasoning and re-serializes
tool arguments); the replacement keeps what the model actually wrote,
reasoning included.

Messages are written as the gateway's chat template is handed them
(:func:`polar.proxy.render.template.template_message`: ``developer`` becomes
``system``, text parts joined with newlines, reasoning as
``reasoning_content``), except that tool-call ``arguments`` stay the JSON text
the model wrote. Tools are ``{"type": "function", "function": {...}}``, as the
model saw them. A conversation that cannot be written (an image part) gets
``problem`` set instead of messages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from polar.ir import ChatRequest, CompletionRecord, Message, Role
from polar.proxy.dialects.registry import dialect_named
from polar.proxy.errors import ProxyError
from polar.proxy.render.template import template_message, template_tools
from polar.trajectory import Trace


def request_of(record: CompletionRecord) -> ChatRequest:
    """The IR request a record's harness sent (its stored wire body, translated again)."""
    read = dialect_named(record.dialect).read_stored
    return read(dict(record.original_request), record.stream)


def chat_message(message: Message) -> dict[str, Any]:
    """One IR message as an OpenAI chat message (arguments as the model wrote them)."""
    out = template_message(message)
    for call, wire in zip(message.tool_calls, out.get("tool_calls", ()), strict=True):
        wire["function"]["arguments"] = call.arguments
    return out


def conversation_messages(records: Sequence[CompletionRecord]) -> tuple[list[Message], ChatRequest]:
    """The IR messages of a trace's calls (in order), and the last call's request."""
    last = records[-1]
    request = request_of(last)
    messages = list(request.messages)
    for record in records[:-1]:
        # This call's reply sits right after its own prompt's messages.
        at = len(request_of(record).messages)
        if (
            record.message is not None
            and at < len(messages)
            and messages[at].role is Role.ASSISTANT
        ):
            messages[at] = record.message
    if last.message is not None:
        messages.append(last.message)
    return messages, request


def conversation_json(trace: Trace, records: Mapping[str, CompletionRecord]) -> dict[str, Any]:
    """``{"trace_id", "messages", "tools", "problem"}`` for one trace."""
    out: dict[str, Any] = {"trace_id": trace.id, "messages": [], "tools": [], "problem": None}
    try:
        messages, request = conversation_messages([records[key] for key in trace.records])
        out["messages"] = [chat_message(message) for message in messages]
        out["tools"] = template_tools(request.tools) or []
    except (ProxyError, ValueError, KeyError) as exc:
        out["problem"] = f"{type(exc).__name__}: {exc}"
    return out
