"""Pure translation between OpenAI Chat Completions wire shapes and the IR."""

from __future__ import annotations

from typing import Any, assert_never

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
from polar.proxy.render.compiled import RENDER_NAMES

# ---------------------------------------------------------------- requests
#
# Requests go to the IR and back without loss (request_to_ir / request_from_ir):
# typed fields are rebuilt from the IR, and what the IR does not model (unknown
# fields, whether content was a string or a list, which of max_tokens and
# max_completion_tokens was used...) rides in ``extra``.

# Top-level fields rebuilt from typed IR fields.
_MODELED = {
    "model", "messages", "tools", "tool_choice", "parallel_tool_calls", "max_tokens",
    "max_completion_tokens", "stream", "temperature", "top_p", "stop", "logprobs",
    "top_logprobs", "seed", "presence_penalty", "frequency_penalty", "top_k", "min_p",
    "repetition_penalty", "chat_template_kwargs", "logit_bias", "response_format",
    "structured_outputs",
}  # fmt: skip
_MESSAGE_MODELED = {
    "role",
    "content",
    "name",
    "tool_calls",
    "tool_call_id",
    "reasoning_content",
    "reasoning",
}


def _parts(content: str | list[ContentPart] | None, *, where: str, images: bool) -> list[Part]:
    if content is None:
        return []
    if isinstance(content, str):
        return [TextPart(content)]
    out: list[Part] = []
    for i, part in enumerate(content):
        rest = part.model_dump(exclude_unset=True)
        if part.type == "text":
            if part.text is None:
                raise InvalidRequest(f"{where}.content[{i}]: text part without 'text'")
            rest.pop("text")
            out.append(TextPart(part.text, extra=rest))
        elif part.type == "refusal" and part.refusal is not None:
            out.append(TextPart(part.refusal, extra=rest))
        elif part.type == "image_url" and images:
            if part.image_url is None:
                raise InvalidRequest(f"{where}.content[{i}]: image_url part without 'image_url'")
            out.append(ImagePart(url=part.image_url.url, detail=part.image_url.detail, extra=rest))
        else:
            raise UnsupportedContent(
                f"{where}.content[{i}]: content part type {part.type!r} is not supported here",
                param=f"{where}.content",
            )
    return out


def _form(content: Any, given: bool) -> str:
    if not given:
        return "absent"
    return "null" if content is None else "string" if isinstance(content, str) else "list"


def _arguments(arguments: str | dict[str, Any]) -> str:
    if isinstance(arguments, str):
        return arguments
    return orjson.dumps(arguments).decode()


def message_to_ir(message: ChatMessage, index: int, fields: dict[str, Any]) -> Message:
    """``fields``: the message's fields as given (``model_dump(exclude_unset=True)``)."""
    where = f"messages[{index}]"
    extra: dict[str, Any] = {
        "wire": {k: v for k, v in fields.items() if k not in _MESSAGE_MODELED},
        "form": _form(message.content, "content" in fields),
    }
    match message.role:
        case "system" | "developer":
            role = Role.SYSTEM if message.role == "system" else Role.DEVELOPER
            parts = _parts(message.content, where=where, images=False)
            return Message(role=role, parts=tuple(parts), name=message.name, extra=extra)
        case "user":
            parts = _parts(message.content, where=where, images=True)
            return Message(role=Role.USER, parts=tuple(parts), name=message.name, extra=extra)
        case "assistant":
            parts = []
            for key in ("reasoning_content", "reasoning"):
                if key in fields:
                    extra["reasoning_key"] = key
                    extra["reasoning_value"] = fields[key]
                    if fields[key]:
                        parts.append(ReasoningPart(fields[key]))
                    break
            parts.extend(_parts(message.content, where=where, images=False))
            if message.tool_calls is not None:
                extra["tool_calls_given"] = True
            for call, raw in zip(
                message.tool_calls or (), fields.get("tool_calls") or (), strict=True
            ):
                function = raw["function"]
                parts.append(
                    ToolCall(
                        id=call.id,
                        name=call.function.name,
                        arguments=_arguments(call.function.arguments),
                        extra={
                            "wire": {k: v for k, v in raw.items() if k not in ("id", "function")},
                            "function": {
                                k: v for k, v in function.items() if k not in ("name", "arguments")
                            },
                            "object_arguments": not isinstance(call.function.arguments, str),
                        },
                    )
                )
            return Message(role=Role.ASSISTANT, parts=tuple(parts), name=message.name, extra=extra)
        case "tool":
            if not message.tool_call_id:
                raise InvalidRequest(
                    f"{where}: a tool message needs 'tool_call_id'", param=f"{where}.tool_call_id"
                )
            return Message(
                role=Role.TOOL,
                parts=tuple(_parts(message.content, where=where, images=False)),
                tool_call_id=message.tool_call_id,
                name=message.name,
                extra=extra,
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
    given = wire.model_dump(exclude_unset=True)
    tools = []
    for i, (tool, raw) in enumerate(zip(wire.tools or (), given.get("tools") or (), strict=True)):
        if tool.type != "function" or tool.function is None:
            raise UnsupportedContent(
                f"tools[{i}]: tool type {tool.type!r} is not supported; only 'function'",
                param=f"tools[{i}].type",
            )
        function = raw["function"]
        tools.append(
            ToolSpec(
                name=tool.function.name,
                description=tool.function.description,
                parameters=tool.function.parameters or {"type": "object", "properties": {}},
                strict=tool.function.strict,
                extra={
                    "wire": {k: v for k, v in raw.items() if k not in ("type", "function")},
                    "given": sorted(
                        k for k in ("description", "parameters", "strict") if k in function
                    ),
                    "function": {
                        k: v
                        for k, v in function.items()
                        if k not in ("name", "description", "parameters", "strict")
                    },
                },
            )
        )
    choice = _tool_choice(wire.tool_choice)
    named = choice.name if choice is not None and choice.mode is ToolChoiceMode.NAMED else None
    if named is not None and not any(t.name == named for t in tools):
        raise InvalidRequest(
            f"tool_choice names {named!r}, which is not among the tools",
            param="tool_choice",
        )
    if clash := sorted(RENDER_NAMES.intersection(wire.chat_template_kwargs or ())):
        # Either capture mode: vLLM refuses chat_template and tokenize itself,
        # and fails on the rest (tools, say) with a 500.
        raise InvalidRequest(
            f"chat_template_kwargs may not set {', '.join(clash)}: "
            "they are the chat template's own arguments",
            param="chat_template_kwargs",
        )
    stop = (wire.stop,) if isinstance(wire.stop, str) else tuple(wire.stop or ())
    try:
        logit_bias = {int(token): float(bias) for token, bias in (wire.logit_bias or {}).items()}
    except ValueError:
        raise InvalidRequest("logit_bias keys must be token ids", param="logit_bias") from None
    stream = bool(wire.stream)
    extra: dict[str, Any] = {k: v for k, v in given.items() if k not in _MODELED}
    # Presence and exact form of modeled fields, for writing the request back.
    extra["_given"] = {
        k: v for k, v in given.items() if k in _MODELED and k not in ("model", "messages", "tools")
    }
    return ChatRequest(
        model=wire.model,
        messages=tuple(
            message_to_ir(m, i, fields)
            for i, (m, fields) in enumerate(zip(wire.messages, given["messages"], strict=True))
        ),
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
        extra=extra,
    )


def _part_json(part: TextPart | ImagePart) -> dict[str, Any]:
    match part:
        case TextPart(text=text, extra=extra):
            if extra.get("type") == "refusal":
                return dict(extra)
            return {**extra, "text": text}
        case ImagePart(extra=extra):
            return dict(extra)
        case _:
            assert_never(part)


def _message_json(message: Message) -> dict[str, Any]:
    extra = message.extra
    out: dict[str, Any] = {"role": message.role.value}
    content_parts = [p for p in message.parts if isinstance(p, (TextPart, ImagePart))]
    form = extra.get("form", "string")
    if form == "string":
        out["content"] = "".join(p.text for p in content_parts if isinstance(p, TextPart))
    elif form == "list":
        out["content"] = [_part_json(p) for p in content_parts]
    elif form == "null":
        out["content"] = None
    if "reasoning_key" in extra:
        out[extra["reasoning_key"]] = extra["reasoning_value"]
    if extra.get("tool_calls_given"):
        out["tool_calls"] = [
            {
                "id": call.id,
                **call.extra.get("wire", {}),
                "function": {
                    "name": call.name,
                    "arguments": (
                        orjson.loads(call.arguments)
                        if call.extra.get("object_arguments")
                        else call.arguments
                    ),
                    **call.extra.get("function", {}),
                },
            }
            for call in message.tool_calls
        ]
    if message.name is not None:
        out["name"] = message.name
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    out.update(extra.get("wire", {}))
    return out


def request_from_ir(request: ChatRequest) -> dict[str, Any]:
    """The Chat Completions body a :func:`request_to_ir` result came from."""
    extra = dict(request.extra)
    given = extra.pop("_given", {})
    body: dict[str, Any] = {"model": request.model}
    body["messages"] = [_message_json(m) for m in request.messages]
    if request.tools or "tools" in given:
        body["tools"] = [
            {
                "type": "function",
                **t.extra.get("wire", {}),
                "function": {
                    "name": t.name,
                    **(
                        {"description": t.description}
                        if "description" in t.extra.get("given", ())
                        else {}
                    ),
                    **(
                        {"parameters": dict(t.parameters)}
                        if "parameters" in t.extra.get("given", ())
                        else {}
                    ),
                    **({"strict": t.strict} if "strict" in t.extra.get("given", ()) else {}),
                    **t.extra.get("function", {}),
                },
            }
            for t in request.tools
        ]
    # Scalar fields are written back as given; their typed values came from them.
    body.update(given)
    body.update(extra)
    return body


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
