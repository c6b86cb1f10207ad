"""Pure translation between OpenAI Chat Completions wire shapes and the IR."""

from __future__ import annotations

from typing import Any

import orjson

from polar.ir import (
    ChatRequest,
    Completion,
    FinishReason,
    ImagePart,
    Message,
    Part,
    ReasoningPart,
    Role,
    Sampling,
    TextPart,
    TokenLogprob,
    ToolCall,
    ToolChoice,
    ToolChoiceMode,
    ToolSpec,
    Usage,
)
from polar.proxy.dialects.openai_chat.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    ContentPart,
    NamedToolChoice,
    WireTokenLogprob,
    WireToolCall,
    WireUsage,
)
from polar.proxy.errors import InvalidRequest, UnsupportedContent

# ---------------------------------------------------------------- requests


def _parts(content: str | list[ContentPart] | None, *, where: str, images: bool) -> list[Part]:
    if content is None:
        return []
    if isinstance(content, str):
        return [TextPart(content)]
    out: list[Part] = []
    for i, part in enumerate(content):
        if part.type == "text":
            if part.text is None:
                raise InvalidRequest(f"{where}.content[{i}]: text part without 'text'")
            out.append(TextPart(part.text))
        elif part.type == "refusal" and part.refusal is not None:
            out.append(TextPart(part.refusal))
        elif part.type == "image_url" and images:
            if part.image_url is None:
                raise InvalidRequest(f"{where}.content[{i}]: image_url part without 'image_url'")
            out.append(ImagePart(url=part.image_url.url, detail=part.image_url.detail))
        else:
            raise UnsupportedContent(
                f"{where}.content[{i}]: content part type {part.type!r} is not supported here",
                param=f"{where}.content",
            )
    return out


def _arguments(arguments: str | dict[str, Any]) -> str:
    if isinstance(arguments, str):
        return arguments
    return orjson.dumps(arguments).decode()


def message_to_ir(message: ChatMessage, index: int) -> Message:
    where = f"messages[{index}]"
    match message.role:
        case "system" | "developer":
            role = Role.SYSTEM if message.role == "system" else Role.DEVELOPER
            return Message(
                role=role,
                parts=tuple(_parts(message.content, where=where, images=False)),
                name=message.name,
            )
        case "user":
            return Message(
                role=Role.USER,
                parts=tuple(_parts(message.content, where=where, images=True)),
                name=message.name,
            )
        case "assistant":
            parts: list[Part] = []
            reasoning = message.reasoning_content or message.reasoning
            if reasoning:
                parts.append(ReasoningPart(reasoning))
            parts.extend(_parts(message.content, where=where, images=False))
            for call in message.tool_calls or ():
                parts.append(
                    ToolCall(
                        id=call.id,
                        name=call.function.name,
                        arguments=_arguments(call.function.arguments),
                    )
                )
            return Message(role=Role.ASSISTANT, parts=tuple(parts), name=message.name)
        case "tool":
            if not message.tool_call_id:
                raise InvalidRequest(
                    f"{where}: a tool message needs 'tool_call_id'", param=f"{where}.tool_call_id"
                )
            return Message(
                role=Role.TOOL,
                parts=tuple(_parts(message.content, where=where, images=False)),
                tool_call_id=message.tool_call_id,
            )
        case "function":
            raise UnsupportedContent(
                f"{where}: legacy 'function' messages are not supported; use tools and "
                "'tool' messages",
                param=f"{where}.role",
            )


def _tool_choice(choice: str | NamedToolChoice | None) -> ToolChoice | None:
    if choice is None:
        return None
    if isinstance(choice, str):
        return ToolChoice(ToolChoiceMode(choice))
    if choice.type != "function" or choice.function is None:
        raise UnsupportedContent(
            f"tool_choice of type {choice.type!r} is not supported", param="tool_choice"
        )
    return ToolChoice(ToolChoiceMode.NAMED, name=choice.function.name)


def request_to_ir(wire: ChatCompletionRequest) -> ChatRequest:
    if wire.n not in (None, 1):
        raise InvalidRequest("n must be 1: the gateway records one sample per call", param="n")
    if wire.top_logprobs is not None and not wire.logprobs:
        raise InvalidRequest("top_logprobs needs logprobs: true", param="top_logprobs")
    tools = []
    for i, tool in enumerate(wire.tools or ()):
        if tool.type != "function" or tool.function is None:
            raise UnsupportedContent(
                f"tools[{i}]: tool type {tool.type!r} is not supported; only 'function'",
                param=f"tools[{i}].type",
            )
        tools.append(
            ToolSpec(
                name=tool.function.name,
                description=tool.function.description,
                parameters=tool.function.parameters or {"type": "object", "properties": {}},
                strict=tool.function.strict,
            )
        )
    choice = _tool_choice(wire.tool_choice)
    named = choice.name if choice is not None and choice.mode is ToolChoiceMode.NAMED else None
    if named is not None and not any(t.name == named for t in tools):
        raise InvalidRequest(
            f"tool_choice names {named!r}, which is not among the tools",
            param="tool_choice",
        )
    stop = (wire.stop,) if isinstance(wire.stop, str) else tuple(wire.stop or ())
    try:
        logit_bias = {int(token): float(bias) for token, bias in (wire.logit_bias or {}).items()}
    except ValueError:
        raise InvalidRequest("logit_bias keys must be token ids", param="logit_bias") from None
    stream = bool(wire.stream)
    return ChatRequest(
        model=wire.model,
        messages=tuple(message_to_ir(m, i) for i, m in enumerate(wire.messages)),
        tools=tuple(tools),
        tool_choice=choice,
        parallel_tool_calls=wire.parallel_tool_calls,
        sampling=Sampling(
            max_tokens=wire.max_completion_tokens or wire.max_tokens,
            temperature=wire.temperature,
            top_p=wire.top_p,
            top_k=wire.top_k,
            min_p=wire.min_p,
            presence_penalty=wire.presence_penalty,
            frequency_penalty=wire.frequency_penalty,
            repetition_penalty=wire.repetition_penalty,
            seed=wire.seed,
            stop=stop,
            logit_bias=logit_bias,
        ),
        stream=stream,
        include_usage=bool(stream and wire.stream_options and wire.stream_options.include_usage),
        top_logprobs=(wire.top_logprobs or 0) if wire.logprobs else None,
        template_kwargs=wire.chat_template_kwargs or {},
        response_format=wire.response_format,
        structured_output=wire.structured_outputs,
    )


# ---------------------------------------------------------------- replies


def finish_reason(reason: FinishReason) -> str:
    # OpenAI has no "abort"; a turn cut short by the engine reads as "length".
    return "length" if reason is FinishReason.ABORT else reason.value


def usage_json(usage: Usage) -> WireUsage:
    out: WireUsage = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }
    if usage.cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": usage.cached_tokens}
    if usage.reasoning_tokens is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": usage.reasoning_tokens}
    return out


def logprobs_json(details: tuple[TokenLogprob, ...], top: int) -> list[WireTokenLogprob]:
    return [
        {
            "token": d.token,
            "logprob": d.logprob,
            "bytes": list(d.bytes) if d.bytes is not None else None,
            "top_logprobs": [
                {
                    "token": t.token,
                    "logprob": t.logprob,
                    "bytes": list(t.bytes) if t.bytes is not None else None,
                }
                for t in d.top[:top]
            ],
        }
        for d in details
    ]


def tool_calls_json(message: Message) -> list[WireToolCall]:
    return [
        {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
        for call in message.tool_calls
    ]


def completion_json(
    completion: Completion,
    *,
    response_id: str,
    created: int,
    model: str,
    reasoning_field: str | None,
    logprobs: list[WireTokenLogprob] | None,
) -> dict[str, Any]:
    message = completion.message
    text = message.text
    wire_message: dict[str, Any] = {
        "role": "assistant",
        "content": text if text or not message.tool_calls else None,
        "refusal": None,
    }
    if reasoning_field is not None and message.reasoning is not None:
        wire_message[reasoning_field] = message.reasoning
    if message.tool_calls:
        wire_message["tool_calls"] = tool_calls_json(message)
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": wire_message,
                "logprobs": {"content": logprobs, "refusal": None}
                if logprobs is not None
                else None,
                "finish_reason": finish_reason(completion.finish_reason),
            }
        ],
        "usage": usage_json(completion.usage),
        "system_fingerprint": None,
    }
