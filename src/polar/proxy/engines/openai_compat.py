"""IR to the OpenAI-compatible chat body that vLLM and SGLang accept, and
their replies back to IR events.

This is the *engine* side of the OpenAI chat format; what clients see is the
business of :mod:`polar.proxy.dialects.openai_chat`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, assert_never

from polar.ir import (
    ChatRequest,
    Delta,
    FinishReason,
    ImagePart,
    Message,
    ReasoningPart,
    Role,
    TextPart,
    TokenLogprob,
    ToolCall,
    ToolCallDelta,
    ToolChoiceMode,
    TopLogprob,
    Usage,
)
from polar.proxy.engines.replies import (
    array,
    count,
    number,
    obj,
    optional_obj,
    optional_text,
    text,
)
from polar.proxy.engines.sampling import sampling_params
from polar.proxy.errors import EngineProtocolError
from polar.proxy.logtext import brief

_FINISH = {
    "stop": FinishReason.STOP,
    "length": FinishReason.LENGTH,
    "tool_calls": FinishReason.TOOL_CALLS,
    "content_filter": FinishReason.CONTENT_FILTER,
    "abort": FinishReason.ABORT,
}


def finish_reason(value: Any) -> FinishReason:
    if isinstance(value, dict):  # SGLang's native form {"type": "stop", ...}
        value = value.get("type")
    try:
        return _FINISH[value]
    except (KeyError, TypeError):
        raise EngineProtocolError(f"engine sent unknown finish_reason {brief(value)}") from None


def content_of(message: Message) -> str | list[dict[str, Any]] | None:
    """Message content as a string when it is plain text, else OpenAI content parts."""
    parts: list[dict[str, Any]] = []
    for part in message.parts:
        match part:
            case TextPart(text=text):
                parts.append({"type": "text", "text": text})
            case ImagePart(url=url, detail=detail):
                image: dict[str, Any] = {"url": url}
                if detail is not None:
                    image["detail"] = detail
                parts.append({"type": "image_url", "image_url": image})
            case ReasoningPart() | ToolCall():
                pass  # carried in their own fields
            case _:
                assert_never(part)
    if not parts:
        return None
    if len(parts) == 1 and parts[0]["type"] == "text":
        return str(parts[0]["text"])
    return parts


def message_json(message: Message, *, reasoning_field: str) -> dict[str, Any]:
    # Qwen-style templates silently drop roles they do not know; "developer" is
    # the OpenAI name for a system message, so it is sent as one.
    role = Role.SYSTEM if message.role is Role.DEVELOPER else message.role
    out: dict[str, Any] = {"role": role.value}
    content = content_of(message)
    if role is Role.ASSISTANT:
        calls = message.tool_calls
        out["content"] = content if content is not None or not calls else None
        if calls:
            out["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in calls
            ]
        reasoning = message.reasoning
        if reasoning is not None:
            out[reasoning_field] = reasoning
    else:
        out["content"] = content if content is not None else ""
    if role is Role.TOOL and message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    return out


def chat_body(
    request: ChatRequest,
    *,
    model: str,
    reasoning_field: str,
    template_kwargs: Mapping[str, Any],
) -> dict[str, Any]:
    """The OpenAI-compatible body common to vLLM and SGLang (no capture flags)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [message_json(m, reasoning_field=reasoning_field) for m in request.messages],
    }
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    **({"description": t.description} if t.description is not None else {}),
                    "parameters": dict(t.parameters),
                    **({"strict": t.strict} if t.strict is not None else {}),
                },
            }
            for t in request.tools
        ]
    choice = request.tool_choice
    if choice is not None and request.tools:
        if choice.mode is ToolChoiceMode.NAMED:
            body["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
        else:
            body["tool_choice"] = choice.mode.value
    if request.parallel_tool_calls is not None and request.tools:
        body["parallel_tool_calls"] = request.parallel_tool_calls
    body.update(sampling_params(request.sampling))
    if request.response_format is not None:
        body["response_format"] = dict(request.response_format)
    kwargs = {**template_kwargs, **request.template_kwargs}
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    return body


def logprob_details(entries: Any) -> tuple[TokenLogprob, ...]:
    """OpenAI ``logprobs.content`` entries to IR."""
    return tuple(_detail(entry) for entry in array(entries, "logprobs.content"))


def _detail(entry: Any) -> TokenLogprob:
    # Every check inline and cheap on the usual shapes; the helpers name what is wrong.
    if type(entry) is not dict:
        obj(entry, "a logprobs entry")
    token, value, raw = entry.get("token"), entry.get("logprob"), entry.get("bytes")
    if type(token) is not str:
        token = text(token, "a logprobs token")
    if type(value) is not float:
        value = number(value, "a logprob")
    top = entry.get("top_logprobs")
    return TokenLogprob(  # positional: a few of these per token add up
        token,
        value,
        None if raw is None else _bytes(raw),
        () if top is None or top == [] else tuple(map(_top, array(top, "top_logprobs"))),
    )


def _top(entry: Any) -> TopLogprob:
    entry = obj(entry, "a top logprob")
    return TopLogprob(
        token=text(entry.get("token"), "a top logprob token"),
        logprob=number(entry.get("logprob"), "a top logprob"),
        bytes=_bytes(entry.get("bytes")),
    )


def _bytes(value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    values = tuple(array(value, "token bytes"))
    try:
        bytes(values)  # ints 0-255 (and bools), checked in C: a few of these per token add up
    except (TypeError, ValueError):
        raise EngineProtocolError("engine sent token bytes that are not bytes") from None
    # ``True in`` also finds a 1 (and ``False`` a 0): only then look at the types.
    if (True in values or False in values) and bool in map(type, values):
        raise EngineProtocolError("engine sent token bytes that are not bytes")
    return values


def tool_call_deltas(raw: Any) -> tuple[ToolCallDelta, ...]:
    if not raw:
        return ()
    out = []
    for position, call in enumerate(array(raw, "tool_calls")):
        call = obj(call, "a tool call")
        function = optional_obj(call.get("function"), "a tool call's function")
        index = call.get("index")
        out.append(
            ToolCallDelta(
                index=count(index, "a tool call index") if index is not None else position,
                id=optional_text(call.get("id"), "a tool call id"),
                name=optional_text(function.get("name"), "a tool name"),
                arguments=text(function.get("arguments"), "tool call arguments"),
            )
        )
    return tuple(out)


def delta_from_message(
    message: Mapping[str, Any],
    *,
    token_ids: tuple[int, ...],
    logprobs: tuple[float, ...],
    details: tuple[TokenLogprob, ...] | None,
) -> Delta:
    """A whole non-streamed assistant message as one delta."""
    reasoning = text(message.get("reasoning") or message.get("reasoning_content"), "reasoning")
    return Delta(
        token_ids=token_ids,
        logprobs=logprobs,
        text=text(message.get("content"), "message content"),
        reasoning=reasoning,
        tool_calls=tool_call_deltas(message.get("tool_calls")),
        details=details,
    )


def usage(raw: Any, *, fallback_prompt: int, fallback_completion: int) -> Usage:
    if not isinstance(raw, dict):
        return Usage(prompt_tokens=fallback_prompt, completion_tokens=fallback_completion)
    prompt_details = optional_obj(raw.get("prompt_tokens_details"), "prompt_tokens_details")
    completion_details = optional_obj(
        raw.get("completion_tokens_details"), "completion_tokens_details"
    )
    reasoning = completion_details.get("reasoning_tokens", raw.get("reasoning_tokens"))
    cached = prompt_details.get("cached_tokens")
    return Usage(
        prompt_tokens=count(raw.get("prompt_tokens", fallback_prompt), "usage.prompt_tokens"),
        completion_tokens=count(
            raw.get("completion_tokens", fallback_completion), "usage.completion_tokens"
        ),
        cached_tokens=None if cached is None else count(cached, "usage cached_tokens"),
        reasoning_tokens=None if reasoning is None else count(reasoning, "reasoning_tokens"),
    )
