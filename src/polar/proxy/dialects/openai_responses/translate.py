"""Pure translation between OpenAI Responses wire shapes and the IR.

Input items become conversation messages: ``message`` items by role
(``developer`` and ``system`` stay distinct in the IR), consecutive
assistant-side items (``reasoning``, assistant ``message``, ``function_call``,
``custom_tool_call``, ``local_shell_call``) one assistant message, and each
``*_output`` item a tool message. ``instructions`` is a leading system message.
Tools: ``function``, ``custom`` (free-form input, shown to the model as one
string parameter ``input``), ``namespace`` groups (flattened; calls carry the
namespace back) and ``local_shell``; hosted tools (web search, file search,
computer use...) are refused with a 400 naming them.

Reasoning the gateway returns carries ``encrypted_content`` that is just the
reasoning text, encoded, so it round-trips through harnesses that send
``store: false`` and replay reasoning items.

:func:`request_from_ir` rebuilds the exact request body from the IR (wire
attributes the IR does not model ride in ``extra``), for lossless round trips.
"""

from __future__ import annotations

import base64
import json
import secrets
from typing import Any, assert_never

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
    ToolCall,
    ToolChoice,
    ToolChoiceMode,
    ToolKind,
    ToolSpec,
    Usage,
)
from polar.proxy.dialects.openai_responses.protocol import ENCRYPTED_REASONING, ResponsesRequest
from polar.proxy.dialects.unmodeled import unmodeled_fields
from polar.proxy.errors import InvalidRequest, UnsupportedContent

_MODELED = {
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "stream",
    "max_output_tokens",
    "temperature",
    "top_p",
}
_ENCRYPTED_PREFIX = "polar1:"
CUSTOM_INPUT_SCHEMA = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "The tool's free-form input."}},
    "required": ["input"],
}
LOCAL_SHELL_SCHEMA = {
    "type": "object",
    "properties": {
        "command": {"type": "array", "items": {"type": "string"}},
        "working_directory": {"type": "string"},
        "timeout_ms": {"type": "integer"},
    },
    "required": ["command"],
}
_ASSISTANT_ITEMS = {"reasoning", "function_call", "custom_tool_call", "local_shell_call"}
_OUTPUT_ITEMS = {"function_call_output", "custom_tool_call_output", "local_shell_call_output"}


def encrypt_reasoning(text: str) -> str:
    """Opaque to clients; decodes back to the reasoning text (nothing secret in it)."""
    return _ENCRYPTED_PREFIX + base64.b64encode(text.encode("utf-8")).decode()


def decrypt_reasoning(value: Any) -> str | None:
    if isinstance(value, str) and value.startswith(_ENCRYPTED_PREFIX):
        try:
            return base64.b64decode(value[len(_ENCRYPTED_PREFIX) :]).decode("utf-8")
        except (ValueError, UnicodeDecodeError):
            return None
    return None


# ---------------------------------------------------------------- requests


def _content_parts(content: Any, where: str) -> tuple[list[Part], str]:
    """Parts of a message/output content, and whether it was a string or a list."""
    if isinstance(content, str):
        return [TextPart(content)], "string"
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}: content must be a string or a list of parts")
    parts: list[Part] = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise InvalidRequest(f"{at}: a content part must be an object with a 'type'")
        kind = part["type"]
        rest = {k: v for k, v in part.items() if k not in ("text",)}
        if kind in ("input_text", "output_text", "summary_text"):
            if not isinstance(part.get("text"), str):
                raise InvalidRequest(f"{at}: {kind} part without a string 'text'")
            parts.append(TextPart(part["text"], extra=rest))
        elif kind == "refusal":
            parts.append(TextPart(str(part.get("refusal", "")), extra=part))
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise UnsupportedContent(f"{at}: input_image without an image_url is not supported")
            parts.append(ImagePart(url=url, detail=part.get("detail"), extra=part))
        else:
            raise UnsupportedContent(f"{at}: content part type {kind!r} is not supported")
    return parts, "list"


def _item_type(item: Any, where: str) -> str:
    if not isinstance(item, dict):
        raise InvalidRequest(f"{where}: an input item must be an object")
    kind = item.get("type")
    if kind is None and "role" in item:
        return "message"  # the short form {"role", "content"}
    if not isinstance(kind, str):
        raise InvalidRequest(f"{where}: an input item needs a 'type'")
    return kind


def _call_part(item: dict[str, Any], kind: str, index: int, where: str) -> ToolCall:
    call_id = item.get("call_id")
    if not isinstance(call_id, str):
        raise InvalidRequest(f"{where}: {kind} without 'call_id'")
    if kind == "function_call":
        name, arguments = item.get("name"), item.get("arguments")
        if not isinstance(name, str) or not isinstance(arguments, str):
            raise InvalidRequest(f"{where}: function_call needs string 'name' and 'arguments'")
        rest = {k: v for k, v in item.items() if k not in ("call_id", "name", "arguments")}
        return ToolCall(
            id=call_id, name=name, arguments=arguments, extra={"item": rest, "at": index}
        )
    if kind == "custom_tool_call":
        name, text = item.get("name"), item.get("input")
        if not isinstance(name, str) or not isinstance(text, str):
            raise InvalidRequest(f"{where}: custom_tool_call needs string 'name' and 'input'")
        rest = {k: v for k, v in item.items() if k not in ("call_id", "name", "input")}
        return ToolCall(
            id=call_id,
            name=name,
            arguments=json.dumps({"input": text}, ensure_ascii=False),
            extra={"item": rest, "at": index},
        )
    action = item.get("action")
    if not isinstance(action, dict):
        raise InvalidRequest(f"{where}: local_shell_call without an 'action'")
    rest = {k: v for k, v in item.items() if k not in ("call_id", "action")}
    return ToolCall(
        id=call_id,
        name="local_shell",
        arguments=json.dumps(action, ensure_ascii=False),
        extra={"item": rest, "at": index},
    )


def _item_texts(item: dict[str, Any], key: str, where: str) -> list[str]:
    """The ``text`` of each part in a reasoning item's ``content`` or ``summary``."""
    value = item.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidRequest(f"{where}.{key}: expected a list of parts")
    texts = []
    for j, part in enumerate(value):
        text = part.get("text", "") if isinstance(part, dict) else None
        if not isinstance(text, str):
            raise InvalidRequest(f"{where}.{key}[{j}]: expected an object with a string 'text'")
        texts.append(text)
    return texts


def _reasoning_part(item: dict[str, Any], index: int) -> ReasoningPart:
    where = f"input[{index}]"
    encrypted = item.get("encrypted_content")
    if encrypted is not None and not isinstance(encrypted, str):
        raise InvalidRequest(f"{where}.encrypted_content: expected a string")
    pieces = _item_texts(item, "content", where)
    summary = _item_texts(item, "summary", where)
    text = "".join(pieces) if pieces else decrypt_reasoning(encrypted)
    if text is None:
        text = "\n".join(summary)
    rest = {k: v for k, v in item.items() if k != "encrypted_content"}
    return ReasoningPart(
        text,
        signature=encrypted if isinstance(encrypted, str) else None,
        extra={"item": rest, "at": index},
    )


def _input_messages(items: list[dict[str, Any]]) -> list[Message]:
    out: list[Message] = []
    assistant: list[Part] = []

    def flush() -> None:
        if assistant:
            out.append(Message(role=Role.ASSISTANT, parts=tuple(assistant)))
            assistant.clear()

    roles = {
        "user": Role.USER,
        "system": Role.SYSTEM,
        "developer": Role.DEVELOPER,
        "assistant": Role.ASSISTANT,
    }
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = _item_type(item, where)
        if kind == "message":
            wire_role = item.get("role")
            role = roles.get(wire_role) if isinstance(wire_role, str) else None
            if role is None:
                raise InvalidRequest(f"{where}: message role must be one of {sorted(roles)}")
            parts, form = _content_parts(item.get("content"), f"{where}.content")
            rest = {k: v for k, v in item.items() if k != "content"}
            if role is Role.ASSISTANT:
                # Assistant text joins the assistant turn being built.
                assistant.extend(
                    TextPart(p.text, extra={**p.extra, "item": rest, "at": i, "form": form})
                    for p in parts
                    if isinstance(p, TextPart)
                )
                continue
            flush()
            out.append(Message(role=role, parts=tuple(parts), extra={"item": rest, "form": form}))
        elif kind == "reasoning":
            assistant.append(_reasoning_part(item, i))
        elif kind in _ASSISTANT_ITEMS:
            assistant.append(_call_part(item, kind, i, where))
        elif kind in _OUTPUT_ITEMS:
            flush()
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise InvalidRequest(f"{where}: {kind} without 'call_id'")
            output = item.get("output", "")
            parts, form = _content_parts(output, f"{where}.output")
            rest = {k: v for k, v in item.items() if k not in ("call_id", "output")}
            out.append(
                Message(
                    role=Role.TOOL,
                    parts=tuple(parts),
                    tool_call_id=call_id,
                    extra={"item": rest, "form": form},
                )
            )
        else:
            raise UnsupportedContent(
                f"{where}: input item type {kind!r} is not supported", param="input"
            )
    flush()
    return out


def _tools(raw: list[dict[str, Any]]) -> list[ToolSpec]:
    specs: list[ToolSpec] = []
    for i, tool in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise InvalidRequest(f"{where}: a tool must be an object")
        kind = tool.get("type")
        if kind == "namespace":
            inner = tool.get("tools")
            if not isinstance(inner, list) or not isinstance(tool.get("name"), str):
                raise InvalidRequest(f"{where}: a namespace needs a 'name' and 'tools'")
            header = {k: v for k, v in tool.items() if k != "tools"}
            for j, sub in enumerate(inner):
                spec = _tool(sub, f"{where}.tools[{j}]", namespace=tool["name"])
                if j == 0:
                    spec = ToolSpec(
                        **{**_fields(spec), "extra": {**spec.extra, "namespace": header}}
                    )
                specs.append(spec)
            if not inner:
                raise InvalidRequest(f"{where}: an empty namespace")
            continue
        specs.append(_tool(tool, where, namespace=None))
    names = [s.name for s in specs]
    duplicated = {n for n in names if names.count(n) > 1}
    if duplicated:
        raise InvalidRequest(
            f"tools: names offered more than once: {sorted(duplicated)}", param="tools"
        )
    return specs


def _fields(spec: ToolSpec) -> dict[str, Any]:
    return {f: getattr(spec, f) for f in spec.__dataclass_fields__}


def _tool(tool: Any, where: str, *, namespace: str | None) -> ToolSpec:
    if not isinstance(tool, dict):
        raise InvalidRequest(f"{where}: a tool must be an object")
    kind = tool.get("type")
    rest = {
        k: v
        for k, v in tool.items()
        if k not in ("type", "name", "description", "parameters", "strict")
    }
    for key, types, expected in (
        ("description", str, "a string"),
        ("parameters", dict, "a JSON Schema object"),
        ("strict", bool, "a boolean"),
    ):
        if tool.get(key) is not None and not isinstance(tool[key], types):
            raise InvalidRequest(f"{where}.{key}: expected {expected}")
    if kind == "function":
        if not isinstance(tool.get("name"), str):
            raise InvalidRequest(f"{where}: a function tool needs a 'name'")
        return ToolSpec(
            name=tool["name"],
            description=tool.get("description"),
            parameters=(
                tool["parameters"]
                if tool.get("parameters") is not None
                else {"type": "object", "properties": {}}
            ),
            strict=tool.get("strict"),
            namespace=namespace,
            extra={
                **rest,
                "given": sorted(k for k in ("description", "parameters", "strict") if k in tool),
            },
        )
    if kind == "custom":
        if not isinstance(tool.get("name"), str):
            raise InvalidRequest(f"{where}: a custom tool needs a 'name'")
        return ToolSpec(
            name=tool["name"],
            description=tool.get("description"),
            parameters=CUSTOM_INPUT_SCHEMA,
            kind=ToolKind.CUSTOM,
            namespace=namespace,
            extra={**rest, "given": sorted(k for k in ("description",) if k in tool)},
        )
    if kind == "local_shell":
        return ToolSpec(
            name="local_shell",
            description="Run a shell command on the user's machine.",
            parameters=LOCAL_SHELL_SCHEMA,
            extra={**rest, "local_shell": True},
        )
    raise UnsupportedContent(
        f"{where}: tool type {kind!r} is not supported (the gateway cannot run hosted tools)",
        param=where,
    )


def _tool_choice(choice: str | dict[str, Any] | None, tools: list[ToolSpec]) -> ToolChoice | None:
    if choice is None:
        return None
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise InvalidRequest(f"tool_choice {choice!r} is not one of auto, none, required")
        return ToolChoice(ToolChoiceMode(choice))
    if choice.get("type") in ("function", "custom") and isinstance(choice.get("name"), str):
        if not any(t.name == choice["name"] for t in tools):
            raise InvalidRequest(
                f"tool_choice names {choice['name']!r}, which is not among the tools"
            )
        return ToolChoice(ToolChoiceMode.NAMED, name=choice["name"])
    raise UnsupportedContent(f"tool_choice of type {choice.get('type')!r} is not supported")


def request_to_ir(wire: ResponsesRequest) -> ChatRequest:
    if wire.previous_response_id is not None:
        raise InvalidRequest(
            "previous_response_id is not supported: the gateway keeps no responses; "
            "send the whole conversation as input (store: false)",
            param="previous_response_id",
        )
    if isinstance(wire.input, str):
        messages = [
            Message(role=Role.USER, parts=(TextPart(wire.input),), extra={"input": "string"})
        ]
    else:
        messages = _input_messages(wire.input)
    if wire.instructions is not None:
        messages.insert(
            0,
            Message(
                role=Role.SYSTEM, parts=(TextPart(wire.instructions),), extra={"instructions": True}
            ),
        )
    tools = _tools(wire.tools or [])
    extra = unmodeled_fields(wire, _MODELED)
    for key in ("tool_choice", "tools", "stream", "parallel_tool_calls"):
        if key in wire.model_fields_set:
            extra[f"_{key}_given"] = True
    if isinstance(wire.tool_choice, dict):
        extra["_tool_choice"] = wire.tool_choice
    response_format = None
    if (
        wire.text
        and isinstance(wire.text.get("format"), dict)
        and wire.text["format"].get("type") != "text"
    ):
        response_format = dict(wire.text["format"])
    return ChatRequest(
        model=wire.model,
        messages=tuple(messages),
        tools=tuple(tools),
        tool_choice=_tool_choice(wire.tool_choice, tools),
        parallel_tool_calls=wire.parallel_tool_calls,
        sampling=Sampling(
            max_tokens=wire.max_output_tokens, temperature=wire.temperature, top_p=wire.top_p
        ),
        stream=bool(wire.stream),
        include_usage=True,
        top_logprobs=wire.top_logprobs,
        response_format=response_format,
        encrypted_reasoning=ENCRYPTED_REASONING in (wire.include or ()),
        extra=extra,
    )


# ---------------------------------------------------------------- back to the wire


def _part_json(part: Part) -> dict[str, Any]:
    match part:
        case TextPart(text=text, extra=extra):
            fields = {k: v for k, v in extra.items() if k not in ("item", "at", "form")}
            if fields.get("type") == "refusal":
                return fields
            return {**fields, "text": text}
        case ImagePart(extra=extra):
            return dict(extra)
        case ReasoningPart() | ToolCall():
            raise UnsupportedContent(f"a {part.kind} part cannot be written as message content")
        case _:
            assert_never(part)


def _content_json(parts: tuple[Part, ...], form: str) -> Any:
    if form == "string":
        return "".join(p.text for p in parts if isinstance(p, TextPart))
    return [_part_json(p) for p in parts]


def _assistant_items(message: Message) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    by_index: dict[int, dict[str, Any]] = {}
    for part in message.parts:
        at = part.extra["at"]
        match part:
            case ReasoningPart(signature=signature, extra=extra):
                item = dict(extra["item"])
                if signature is not None:
                    item["encrypted_content"] = signature
                items.append(item)
            case ToolCall(id=call_id, name=name, arguments=arguments, extra=extra):
                item = dict(extra["item"])
                kind = item.get("type")
                if kind == "custom_tool_call":
                    item.update(call_id=call_id, name=name, input=json.loads(arguments)["input"])
                elif kind == "local_shell_call":
                    item.update(call_id=call_id, action=json.loads(arguments))
                else:
                    item.update(call_id=call_id, name=name, arguments=arguments)
                items.append(item)
            case TextPart(extra=extra):
                if at not in by_index:
                    item = {**extra["item"], "content": "" if extra["form"] == "string" else []}
                    by_index[at] = item
                    items.append(item)
                item = by_index[at]
                if extra["form"] == "string":
                    item["content"] += part.text
                else:
                    item["content"].append(_part_json(part))
    return items


def _tools_json(tools: tuple[ToolSpec, ...]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for spec in tools:
        extra = dict(spec.extra)
        header = extra.pop("namespace", None)
        given = extra.pop("given", [])
        if extra.pop("local_shell", False):
            tool: dict[str, Any] = {"type": "local_shell", **extra}
        else:
            tool = {"type": spec.kind.value, "name": spec.name}
            if "description" in given:
                tool["description"] = spec.description
            if spec.kind is ToolKind.FUNCTION:
                if "parameters" in given:
                    tool["parameters"] = dict(spec.parameters)
                if "strict" in given:
                    tool["strict"] = spec.strict
            tool.update(extra)
        if spec.namespace is None:
            out.append(tool)
        elif header is not None:
            out.append({**header, "tools": [tool]})
        else:
            out[-1]["tools"].append(tool)
    return out


def request_from_ir(request: ChatRequest) -> dict[str, Any]:
    """The Responses body a :func:`request_to_ir` result came from."""
    extra = dict(request.extra)
    given = {
        key: extra.pop(f"_{key}_given", False)
        for key in ("tool_choice", "tools", "stream", "parallel_tool_calls")
    }
    choice_object = extra.pop("_tool_choice", None)
    body: dict[str, Any] = {"model": request.model}
    messages = list(request.messages)
    if messages and messages[0].extra.get("instructions"):
        body["instructions"] = messages.pop(0).text
    if len(messages) == 1 and messages[0].extra.get("input") == "string":
        body["input"] = messages[0].text
    else:
        items: list[dict[str, Any]] = []
        for message in messages:
            if message.role is Role.ASSISTANT:
                items.extend(_assistant_items(message))
            elif message.role is Role.TOOL:
                items.append(
                    {
                        **message.extra["item"],
                        "call_id": message.tool_call_id,
                        "output": _content_json(message.parts, message.extra["form"]),
                    }
                )
            else:
                items.append(
                    {
                        **message.extra["item"],
                        "content": _content_json(message.parts, message.extra["form"]),
                    }
                )
        body["input"] = items
    if given["tools"]:
        body["tools"] = _tools_json(request.tools)
    if given["tool_choice"]:
        body["tool_choice"] = (
            choice_object
            if choice_object is not None
            else (request.tool_choice.mode.value if request.tool_choice else None)
        )
    if given["parallel_tool_calls"]:
        body["parallel_tool_calls"] = request.parallel_tool_calls
    if given["stream"]:
        body["stream"] = request.stream
    s = request.sampling
    for key, value in (
        ("max_output_tokens", s.max_tokens),
        ("temperature", s.temperature),
        ("top_p", s.top_p),
    ):
        if value is not None:
            body[key] = value
    body.update(extra)
    return body


# ---------------------------------------------------------------- replies


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def usage_json(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": usage.cached_tokens or 0,
            "cache_write_tokens": 0,
        },
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens or 0},
        "total_tokens": usage.total_tokens,
    }


def reasoning_item(text: str, item_id: str, request: ChatRequest) -> dict[str, Any]:
    item: dict[str, Any] = {
        "id": item_id,
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    }
    if request.encrypted_reasoning:
        item["encrypted_content"] = encrypt_reasoning(text)
    return item


def message_item(text: str, item_id: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def call_item(call: ToolCall, item_id: str, request: ChatRequest, status: str) -> dict[str, Any]:
    """The output item for a call, shaped by the tool it calls."""
    spec = next((t for t in request.tools if t.name == call.name), None)
    if spec is not None and spec.kind is ToolKind.CUSTOM:
        try:
            value = json.loads(call.arguments).get("input", call.arguments)
        except (json.JSONDecodeError, AttributeError):
            value = call.arguments
        return {
            "id": item_id,
            "type": "custom_tool_call",
            "status": status,
            "call_id": call.id,
            "name": call.name,
            "input": value if isinstance(value, str) else json.dumps(value),
        }
    if spec is not None and spec.extra.get("local_shell"):
        try:
            action = json.loads(call.arguments)
        except json.JSONDecodeError:
            action = {"command": []}
        return {
            "id": item_id,
            "type": "local_shell_call",
            "status": status,
            "call_id": call.id,
            "action": {"type": "exec", **{k: v for k, v in action.items() if k != "type"}},
        }
    item = {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
    }
    if spec is not None and spec.namespace is not None:
        item["namespace"] = spec.namespace
    return item


def response_json(
    request: ChatRequest,
    *,
    response_id: str,
    created_at: int,
    status: str,
    output: list[dict[str, Any]],
    usage: Usage | None,
    finish: FinishReason | None,
) -> dict[str, Any]:
    reasoning = request.extra.get("reasoning") or {}
    instructions = (
        request.messages[0].text
        if request.messages and request.messages[0].extra.get("instructions")
        else None
    )
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "error": None,
        "incomplete_details": (
            {"reason": "max_output_tokens"} if finish is FinishReason.LENGTH else None
        ),
        "instructions": instructions,
        "max_output_tokens": request.sampling.max_tokens,
        "model": request.model,
        "output": output,
        "parallel_tool_calls": request.parallel_tool_calls is not False,
        "previous_response_id": None,
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "store": bool(request.extra.get("store", False)),
        "temperature": request.sampling.temperature
        if request.sampling.temperature is not None
        else 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": request.tool_choice.mode.value
        if request.tool_choice and request.tool_choice.mode is not ToolChoiceMode.NAMED
        else "auto",
        "tools": _tools_json(request.tools) if request.tools else [],
        "top_p": request.sampling.top_p if request.sampling.top_p is not None else 1.0,
        "truncation": "disabled",
        "usage": usage_json(usage) if usage is not None else None,
        "user": None,
        "metadata": request.extra.get("metadata") or {},
    }


def completion_output(completion: Completion, request: ChatRequest) -> list[dict[str, Any]]:
    message = completion.message
    output: list[dict[str, Any]] = []
    if message.reasoning:
        output.append(reasoning_item(message.reasoning, new_id("rs"), request))
    if message.text.strip():  # whitespace alone is template glue, not a message
        output.append(message_item(message.text, new_id("msg"), "completed"))
    output.extend(call_item(c, new_id("fc"), request, "completed") for c in message.tool_calls)
    return output


def final_status(finish: FinishReason) -> str:
    return "incomplete" if finish is FinishReason.LENGTH else "completed"
