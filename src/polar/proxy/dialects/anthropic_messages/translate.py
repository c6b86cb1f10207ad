"""Pure translation between Anthropic Messages wire shapes and the IR.

Requests go to the IR and back without loss (:func:`request_to_ir`,
:func:`request_from_ir`): what the IR models is rebuilt from its typed fields,
and wire attributes it does not model (``cache_control``, ``citations``,
betas such as ``context_management``) ride in ``extra`` mappings.

Mapping notes:

* a user message's ``tool_result`` blocks become ``tool`` messages (one per
  block, in order), its other blocks a ``user`` message; ``role: system``
  items inside ``messages`` stay where they are;
* Claude Code's first system block, ``x-anthropic-billing-header: ...``,
  changes on every request; it is removed before rendering (so prompts stay
  prefixes of each other) and the removal is recorded as a request edit;
* ``thinking`` blocks are reasoning with their signature; the gateway signs the
  reasoning it returns so the signature round-trips.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, assert_never

from polar.ir import (
    ChatRequest,
    Completion,
    EditKind,
    FinishReason,
    ImagePart,
    Message,
    Part,
    ReasoningPart,
    RequestEdit,
    Role,
    Sampling,
    TextPart,
    ToolCall,
    ToolChoice,
    ToolChoiceMode,
    ToolSpec,
    Usage,
)
from polar.proxy.dialects.anthropic_messages.protocol import (
    ERROR_TYPES,
    MessagesRequest,
    ToolChoiceParam,
    ToolDef,
    WireMessage,
)
from polar.proxy.dialects.unmodeled import unmodeled_fields
from polar.proxy.errors import InvalidRequest, ProxyError, UnsupportedContent

BILLING_PREFIX = "x-anthropic-billing-header"

# Top-level fields rebuilt from typed IR fields; everything else rides in extra.
_MODELED = {
    "model",
    "max_tokens",
    "messages",
    "system",
    "stop_sequences",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "tools",
    "tool_choice",
}


def signature_for(text: str) -> str:
    """The signature the gateway puts on reasoning it returns (opaque to clients)."""
    return "polar-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:40]


def _rest(block: dict[str, Any], *modeled: str) -> dict[str, Any]:
    return {k: v for k, v in block.items() if k not in ("type", *modeled)}


def _image(block: dict[str, Any], where: str) -> ImagePart:
    source = block.get("source")
    if not isinstance(source, dict):
        raise InvalidRequest(f"{where}: image block without 'source'")
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    elif source.get("type") == "url":
        url = str(source.get("url", ""))
    else:
        raise UnsupportedContent(
            f"{where}: image source type {source.get('type')!r} is not supported"
        )
    return ImagePart(url=url, extra=_rest(block))


def _text_block(block: dict[str, Any], where: str) -> TextPart:
    text = block.get("text")
    if not isinstance(text, str):
        raise InvalidRequest(f"{where}: text block without a string 'text'")
    return TextPart(text, extra=_rest(block, "text"))


def _block_type(block: Any, where: str) -> str:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise InvalidRequest(f"{where}: a content block must be an object with a 'type'")
    return str(block["type"])


def _tool_result(block: dict[str, Any], where: str, wire_index: int) -> Message:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str):
        raise InvalidRequest(f"{where}: tool_result without 'tool_use_id'")
    content = block.get("content")
    parts: list[Part] = []
    if isinstance(content, str):
        form = "string"
        parts.append(TextPart(content))
    elif content is None:
        form = "absent"
    elif isinstance(content, list):
        form = "blocks"
        for j, inner in enumerate(content):
            kind = _block_type(inner, f"{where}.content[{j}]")
            if kind == "text":
                parts.append(_text_block(inner, f"{where}.content[{j}]"))
            elif kind == "image":
                parts.append(_image(inner, f"{where}.content[{j}]"))
            else:
                raise UnsupportedContent(
                    f"{where}.content[{j}]: content block type {kind!r} is not supported "
                    "in a tool_result"
                )
    else:
        raise InvalidRequest(f"{where}: tool_result content must be a string or a list")
    return Message(
        role=Role.TOOL,
        parts=tuple(parts),
        tool_call_id=call_id,
        is_error=bool(block.get("is_error", False)),
        extra={
            "wire_index": wire_index,
            "content_form": form,
            "block": _rest(block, "tool_use_id", "content"),
        },
    )


def _messages(message: WireMessage, index: int) -> list[Message]:
    where = f"messages[{index}]"
    role = {"user": Role.USER, "assistant": Role.ASSISTANT, "system": Role.SYSTEM}[message.role]
    wire_extra = {**(message.model_extra or {})}
    if isinstance(message.content, str):
        return [
            Message(
                role=role,
                parts=(TextPart(message.content),),
                extra={"wire_index": index, "content_form": "string", "wire": wire_extra},
            )
        ]
    out: list[Message] = []
    parts: list[Part] = []

    def flush() -> None:
        if parts:
            out.append(
                Message(
                    role=role,
                    parts=tuple(parts),
                    extra={"wire_index": index, "content_form": "blocks", "wire": wire_extra},
                )
            )
            parts.clear()

    for j, block in enumerate(message.content):
        at = f"{where}.content[{j}]"
        kind = _block_type(block, at)
        if kind == "text":
            parts.append(_text_block(block, at))
        elif kind == "image" and role is Role.USER:
            parts.append(_image(block, at))
        elif kind == "tool_result" and role is Role.USER:
            flush()
            out.append(_tool_result(block, at, index))
        elif kind == "tool_use" and role is Role.ASSISTANT:
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise InvalidRequest(f"{at}: tool_use needs 'id' and 'name'")
            arguments = block.get("input", {})
            if not isinstance(arguments, dict):
                raise InvalidRequest(f"{at}: tool_use 'input' must be an object")
            parts.append(
                ToolCall(
                    id=block["id"],
                    name=block["name"],
                    arguments=json.dumps(arguments, ensure_ascii=False),
                    extra=_rest(block, "id", "name", "input"),
                )
            )
        elif kind == "thinking" and role is Role.ASSISTANT:
            thinking = block.get("thinking")
            if not isinstance(thinking, str):
                raise InvalidRequest(f"{at}: thinking block without a string 'thinking'")
            parts.append(
                ReasoningPart(
                    thinking,
                    signature=block.get("signature"),
                    extra=_rest(block, "thinking", "signature"),
                )
            )
        elif kind == "redacted_thinking" and role is Role.ASSISTANT:
            parts.append(ReasoningPart("", extra={"redacted": _rest(block)}))
        else:
            raise UnsupportedContent(
                f"{at}: content block type {kind!r} is not supported in a {message.role} message",
                param=f"{where}.content",
            )
    flush()
    if not out:  # an empty block list is still a turn
        out.append(
            Message(
                role=role, extra={"wire_index": index, "content_form": "blocks", "wire": wire_extra}
            )
        )
    return out


def _system(
    system: str | list[dict[str, Any]] | None,
) -> tuple[list[Message], list[RequestEdit], dict[str, Any]]:
    """The ``system`` parameter as a leading system message, billing header removed."""
    if system is None:
        return [], [], {}
    if isinstance(system, str):
        if system.startswith(BILLING_PREFIX):
            header, _, rest = system.partition("\n")
            edit = RequestEdit(EditKind.STRIPPED_BILLING_HEADER, header)
            message = Message(role=Role.SYSTEM, parts=(TextPart(rest),), extra={"source": "system"})
            return [message], [edit], {"system_form": "string", "billing": header}
        message = Message(role=Role.SYSTEM, parts=(TextPart(system),), extra={"source": "system"})
        return [message], [], {"system_form": "string"}
    parts: list[Part] = []
    edits: list[RequestEdit] = []
    kept: dict[str, Any] = {"system_form": "blocks"}
    for j, block in enumerate(system):
        at = f"system[{j}]"
        if _block_type(block, at) != "text":
            raise UnsupportedContent(f"{at}: system block type {block['type']!r} is not supported")
        part = _text_block(block, at)
        if j == 0 and part.text.startswith(BILLING_PREFIX):
            edits.append(RequestEdit(EditKind.STRIPPED_BILLING_HEADER, part.text))
            kept["billing"] = block
            continue
        parts.append(part)
    message = Message(role=Role.SYSTEM, parts=tuple(parts), extra={"source": "system"})
    return [message], edits, kept


def _tool(tool: ToolDef, index: int) -> ToolSpec:
    if tool.type not in (None, "custom"):
        raise UnsupportedContent(
            f"tools[{index}]: tool type {tool.type!r} is a server tool the gateway cannot run",
            param=f"tools[{index}].type",
        )
    if tool.input_schema is None:
        raise InvalidRequest(f"tools[{index}]: input_schema: field required")
    extra = {**(tool.model_extra or {})}
    if tool.type is not None:
        extra["type"] = tool.type
    return ToolSpec(
        name=tool.name, description=tool.description, parameters=tool.input_schema, extra=extra
    )


def _tool_choice(choice: ToolChoiceParam | None, tools: list[ToolSpec]) -> ToolChoice | None:
    if choice is None:
        return None
    if choice.type == "tool":
        if not choice.name or not any(t.name == choice.name for t in tools):
            raise InvalidRequest(
                f"tool_choice names {choice.name!r}, which is not among the tools",
                param="tool_choice",
            )
        return ToolChoice(ToolChoiceMode.NAMED, name=choice.name)
    mode = {
        "auto": ToolChoiceMode.AUTO,
        "any": ToolChoiceMode.REQUIRED,
        "none": ToolChoiceMode.NONE,
    }
    return ToolChoice(mode[choice.type])


def request_to_ir(wire: MessagesRequest) -> ChatRequest:
    system, edits, kept = _system(wire.system)
    messages = [m for i, message in enumerate(wire.messages) for m in _messages(message, i)]
    tools = [_tool(t, i) for i, t in enumerate(wire.tools or ())]
    extra = unmodeled_fields(wire, _MODELED)
    if kept:
        extra["_system"] = kept
    if wire.tool_choice is not None:
        extra["_tool_choice"] = wire.tool_choice.model_dump(exclude_unset=True)
    if "stream" in wire.model_fields_set:
        extra["_stream_given"] = True
    thinking = wire.thinking
    kwargs = {"enable_thinking": thinking.type != "disabled"} if thinking is not None else {}
    parallel = None
    if wire.tool_choice is not None and wire.tool_choice.disable_parallel_tool_use is not None:
        parallel = not wire.tool_choice.disable_parallel_tool_use
    return ChatRequest(
        model=wire.model,
        messages=tuple(system + messages),
        tools=tuple(tools),
        tool_choice=_tool_choice(wire.tool_choice, tools),
        parallel_tool_calls=parallel,
        sampling=Sampling(
            max_tokens=wire.max_tokens,
            temperature=wire.temperature,
            top_p=wire.top_p,
            top_k=wire.top_k,
            stop=tuple(wire.stop_sequences or ()),
        ),
        stream=bool(wire.stream),
        include_usage=True,
        template_kwargs=kwargs,
        edits=tuple(edits),
        extra=extra,
    )


def shows_thinking(request: ChatRequest) -> bool:
    """Whether the client asked for thinking blocks in replies."""
    thinking = request.extra.get("thinking")
    return isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")


# ---------------------------------------------------------------- back to the wire


def _part_block(part: Part) -> dict[str, Any]:
    match part:
        case TextPart(text=text, extra=extra):
            return {"type": "text", "text": text, **extra}
        case ImagePart(extra=extra):
            return {"type": "image", **extra}
        case ReasoningPart(text=text, signature=signature, extra=extra):
            if "redacted" in extra:
                return {"type": "redacted_thinking", **extra["redacted"]}
            block: dict[str, Any] = {"type": "thinking", "thinking": text}
            if signature is not None:
                block["signature"] = signature
            return {**block, **extra}
        case ToolCall(id=call_id, name=name, arguments=arguments, extra=extra):
            return {
                "type": "tool_use",
                "id": call_id,
                "name": name,
                "input": json.loads(arguments),
                **extra,
            }
        case _:
            assert_never(part)


def _tool_result_block(message: Message) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.tool_call_id}
    form = message.extra.get("content_form")
    if form == "string":
        block["content"] = message.text
    elif form == "blocks":
        block["content"] = [_part_block(p) for p in message.parts]
    block.update(message.extra.get("block", {}))
    return block


def request_from_ir(request: ChatRequest) -> dict[str, Any]:
    """The Anthropic body a :func:`request_to_ir` result came from."""
    extra = dict(request.extra)
    system_kept = extra.pop("_system", None)
    tool_choice = extra.pop("_tool_choice", None)
    stream_given = extra.pop("_stream_given", False)
    body: dict[str, Any] = {"model": request.model, "max_tokens": request.sampling.max_tokens}
    messages = list(request.messages)
    if messages and messages[0].extra.get("source") == "system":
        first = messages.pop(0)
        if system_kept["system_form"] == "string":
            text = first.text
            if "billing" in system_kept:
                text = system_kept["billing"] + "\n" + text
            body["system"] = text
        else:
            blocks = [_part_block(p) for p in first.parts]
            if "billing" in system_kept:
                blocks.insert(0, system_kept["billing"])
            body["system"] = blocks
    wire: list[dict[str, Any]] = []
    current: int | None = None
    for message in messages:
        index = message.extra["wire_index"]
        if index != current:
            role = (
                "system"
                if message.role is Role.SYSTEM
                else ("assistant" if message.role is Role.ASSISTANT else "user")
            )
            # A tool message's content_form is its tool_result block's; the user
            # message holding the block always has a block list.
            form = "blocks" if message.role is Role.TOOL else message.extra.get("content_form")
            wire.append(
                {
                    "role": role,
                    "content": "" if form == "string" else [],
                    **message.extra.get("wire", {}),
                }
            )
            current = index
        target = wire[-1]
        if message.role is Role.TOOL:
            target["content"].append(_tool_result_block(message))
        elif message.extra.get("content_form") == "string":
            target["content"] = message.text
        else:
            target["content"].extend(_part_block(p) for p in message.parts)
    body["messages"] = wire
    if request.sampling.stop:
        body["stop_sequences"] = list(request.sampling.stop)
    if stream_given:
        body["stream"] = request.stream
    for key in ("temperature", "top_p", "top_k"):
        value = getattr(request.sampling, key)
        if value is not None:
            body[key] = value
    if request.tools:
        body["tools"] = [
            {
                "name": t.name,
                **({"description": t.description} if t.description is not None else {}),
                "input_schema": dict(t.parameters),
                **t.extra,
            }
            for t in request.tools
        ]
    if tool_choice is not None:
        body["tool_choice"] = tool_choice
    body.update(extra)
    return body


# ---------------------------------------------------------------- replies


def stop_reason(
    reason: FinishReason, matched: str | int | None, stops: tuple[str, ...]
) -> tuple[str, str | None]:
    if reason is FinishReason.TOOL_CALLS:
        return "tool_use", None
    if reason is FinishReason.LENGTH:
        return "max_tokens", None
    if isinstance(matched, str) and matched in stops:
        return "stop_sequence", matched
    return "end_turn", None


def usage_json(usage: Usage) -> dict[str, int]:
    return {
        "input_tokens": usage.prompt_tokens,
        "output_tokens": usage.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens or 0,
    }


def tool_input(arguments: str) -> dict[str, Any] | None:
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def message_json(
    completion: Completion,
    request: ChatRequest,
    *,
    message_id: str,
    matched_stop: str | int | None,
) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    message = completion.message
    reasoning = message.reasoning
    if reasoning and shows_thinking(request):
        content.append(
            {"type": "thinking", "thinking": reasoning, "signature": signature_for(reasoning)}
        )
    if message.text.strip():  # whitespace alone is template glue, not a text block
        content.append({"type": "text", "text": message.text})
    for call in message.tool_calls:
        arguments = tool_input(call.arguments)
        if arguments is None:  # not an object: return what the model wrote, as text
            content.append({"type": "text", "text": call.arguments})
            continue
        content.append({"type": "tool_use", "id": call.id, "name": call.name, "input": arguments})
    reason, sequence = stop_reason(completion.finish_reason, matched_stop, request.sampling.stop)
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": request.model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage_json(completion.usage),
    }


def error_json(error: ProxyError) -> dict[str, Any]:
    kind = ERROR_TYPES.get(error.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": error.message}}
