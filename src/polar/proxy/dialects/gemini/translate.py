"""Pure translation between Gemini API wire shapes and the IR.

Requests go to the IR and back without loss (:func:`request_to_ir`,
:func:`request_from_ir`): what the IR models is rebuilt from its typed fields,
and wire attributes it does not model (``thoughtSignature``, safety settings,
``thinkingConfig``, a content's own keys) ride in ``extra`` mappings.

Mapping notes:

* ``systemInstruction`` is a leading system message; ``contents`` roles
  ``user`` (or none) and ``model`` are user and assistant turns;
* a user turn's ``functionResponse`` parts become ``tool`` messages (one per
  part, in order), its other parts a ``user`` message; the tool message's text
  is ``response.output`` (``response.error``, flagged as an error) when that is
  the response's one field, else the response as JSON;
* a model turn's ``thought`` parts are reasoning (``thoughtSignature`` as its
  signature), ``functionCall`` parts tool calls with ``args`` as JSON text;
  calls and responses without an ``id`` (the Gemini API gives none) are paired
  by name, in order, under ids the gateway makes up and never sends back;
* tools come from ``functionDeclarations`` with ``parametersJsonSchema``, or
  ``parameters`` (Google's OpenAPI-style schema, its upper-case type names
  lowered for the template); server tools (search, code execution) are refused;
* ``generationConfig`` gives sampling, the output limit, stop sequences, a JSON
  response format (``responseJsonSchema``/``responseSchema``), logprobs
  (``responseLogprobs``), and whether thoughts are returned (``thinkingConfig``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
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
    TokenLogprob,
    ToolCall,
    ToolChoice,
    ToolChoiceMode,
    ToolSpec,
    Usage,
)
from polar.proxy.dialects.gemini.protocol import (
    ERROR_STATUSES,
    Content,
    GenerateContentRequest,
    GenerationConfig,
    Tool,
    ToolConfig,
)
from polar.proxy.dialects.unmodeled import unmodeled_fields
from polar.proxy.errors import InvalidRequest, ProxyError, UnsupportedContent

MODEL_PREFIX = "models/"

# generationConfig keys rebuilt from typed IR fields; the rest ride in extra.
_SAMPLING_KEYS = {
    "maxOutputTokens": "max_tokens",
    "temperature": "temperature",
    "topP": "top_p",
    "topK": "top_k",
    "seed": "seed",
    "presencePenalty": "presence_penalty",
    "frequencyPenalty": "frequency_penalty",
}
_MODELED = {"model", "contents", "tools", "toolConfig", "systemInstruction", "generationConfig"}
_SERVER_TOOLS = "server tool the gateway cannot run"


def model_name(model: str) -> str:
    """``models/gemini-x`` -> ``gemini-x`` (what replies call ``modelVersion``)."""
    return model.removeprefix(MODEL_PREFIX)


# ---------------------------------------------------------------- schemas


def json_schema(schema: Any) -> Any:
    """Google's OpenAPI-style ``Schema`` as JSON Schema: ``type`` names lower-cased
    (``OBJECT`` -> ``object``) at every level; everything else as it is."""
    if isinstance(schema, list):
        return [json_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, str):
            out[key] = value.lower()
        elif key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            out[key] = {name: json_schema(sub) for name, sub in value.items()}
        elif key in ("items", "anyOf", "oneOf", "allOf", "not", "additionalProperties"):
            out[key] = json_schema(value)
        else:
            out[key] = value
    return out


# ---------------------------------------------------------------- to the IR


def _rest(mapping: Mapping[str, Any], *modeled: str) -> dict[str, Any]:
    return {k: v for k, v in mapping.items() if k not in modeled}


def _part_kind(part: Any, where: str) -> str:
    """The part's data field (``text``, ``functionCall``...); exactly one is allowed."""
    if not isinstance(part, dict):
        raise InvalidRequest(f"{where}: a part must be an object")
    kinds = [
        k for k in part if k not in ("thought", "thoughtSignature", "partMetadata", "videoMetadata")
    ]
    if len(kinds) != 1:
        named = ", ".join(repr(k) for k in kinds[:4]) or "none"
        raise InvalidRequest(f"{where}: a part holds exactly one kind of data (found {named})")
    return str(kinds[0])


def _text(part: dict[str, Any], where: str) -> str:
    text = part.get("text")
    if not isinstance(text, str):
        raise InvalidRequest(f"{where}: 'text' must be a string")
    return text


def _image(part: dict[str, Any], kind: str, where: str) -> ImagePart:
    data = part[kind]
    if not isinstance(data, dict) or not isinstance(data.get("mimeType"), str):
        raise InvalidRequest(f"{where}: {kind} needs a 'mimeType'")
    mime = data["mimeType"]
    if not mime.startswith("image/"):
        raise UnsupportedContent(f"{where}: {kind} of type {mime!r} is not supported (images only)")
    field = "data" if kind == "inlineData" else "fileUri"
    value = data.get(field)
    if not isinstance(value, str):
        raise InvalidRequest(f"{where}: {kind} needs a string {field!r}")
    url = f"data:{mime};base64,{value}" if kind == "inlineData" else value
    return ImagePart(
        url=url,
        extra={
            "kind": kind,
            "mime": mime,
            "data": _rest(data, "mimeType", field),
            "part": _rest(part, kind),
        },
    )


class _Calls:
    """Ids for calls and responses that carry none: a response takes the oldest
    unanswered call of its name."""

    def __init__(self) -> None:
        self.open: dict[str, list[str]] = {}

    def call(self, name: str, given: str | None, where: str) -> str:
        call_id = given if given is not None else f"{name}#{where}"
        self.open.setdefault(name, []).append(call_id)
        return call_id

    def response(self, name: str, given: str | None, where: str) -> str:
        waiting = self.open.get(name, [])
        if given is not None:
            if given in waiting:
                waiting.remove(given)
            return given
        return waiting.pop(0) if waiting else f"{name}#{where}"


def _function_call(part: dict[str, Any], where: str, calls: _Calls) -> ToolCall:
    call = part["functionCall"]
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
        raise InvalidRequest(f"{where}: functionCall needs a 'name'")
    given = call.get("id")
    if given is not None and not isinstance(given, str):
        raise InvalidRequest(f"{where}: functionCall 'id' must be a string")
    args = call.get("args", {})
    if not isinstance(args, dict):
        raise InvalidRequest(f"{where}: functionCall 'args' must be an object")
    return ToolCall(
        id=calls.call(call["name"], given, where),
        name=call["name"],
        arguments=json.dumps(args, ensure_ascii=False),
        extra={
            "call": _rest(call, "id", "name", "args"),
            "part": _rest(part, "functionCall"),
            "id_given": given is not None,
            "args_given": "args" in call,
        },
    )


def _function_response(part: dict[str, Any], where: str, calls: _Calls, wire_index: int) -> Message:
    response = part["functionResponse"]
    if not isinstance(response, dict) or not isinstance(response.get("name"), str):
        raise InvalidRequest(f"{where}: functionResponse needs a 'name'")
    given = response.get("id")
    if given is not None and not isinstance(given, str):
        raise InvalidRequest(f"{where}: functionResponse 'id' must be a string")
    if response.get("parts"):
        raise UnsupportedContent(f"{where}: functionResponse 'parts' are not supported")
    body = response.get("response", {})
    if not isinstance(body, dict):
        raise InvalidRequest(f"{where}: functionResponse 'response' must be an object")
    only = next(iter(body)) if len(body) == 1 else None
    if only in ("output", "error") and isinstance(body[only], str):
        form, text = only, body[only]
    else:
        form, text = "json", json.dumps(body, ensure_ascii=False)
    return Message(
        role=Role.TOOL,
        parts=(TextPart(text),),
        name=response["name"],
        tool_call_id=calls.response(response["name"], given, where),
        is_error=form == "error",
        extra={
            "wire_index": wire_index,
            "form": form,
            "id_given": given is not None,
            "response_given": "response" in response,
            "call": _rest(response, "id", "name", "response"),
            "part": _rest(part, "functionResponse"),
        },
    )


def _model_part(part: dict[str, Any], kind: str, where: str, calls: _Calls) -> Part:
    if kind == "text":
        text = _text(part, where)
        if part.get("thought") is True:
            return ReasoningPart(
                text,
                signature=part.get("thoughtSignature"),
                extra=_rest(part, "text", "thought", "thoughtSignature"),
            )
        return TextPart(text, extra=_rest(part, "text"))
    if kind == "functionCall":
        return _function_call(part, where, calls)
    raise UnsupportedContent(
        f"{where}: part kind {kind!r} is not supported in a model turn", param=where
    )


def _messages(content: Content, index: int, calls: _Calls) -> list[Message]:
    where = f"contents[{index}]"
    if content.role not in (None, "user", "model"):
        raise InvalidRequest(
            f"{where}.role: must be 'user' or 'model', not {content.role!r}", param=f"{where}.role"
        )
    role = Role.ASSISTANT if content.role == "model" else Role.USER
    wire = {**(content.model_extra or {}), **({"role": content.role} if content.role else {})}
    out: list[Message] = []
    parts: list[Part] = []

    def flush() -> None:
        if parts:
            out.append(Message(role=role, parts=tuple(parts), extra={"wire_index": index}))
            parts.clear()

    for j, part in enumerate(content.parts):
        at = f"{where}.parts[{j}]"
        kind = _part_kind(part, at)
        if role is Role.ASSISTANT:
            parts.append(_model_part(part, kind, at, calls))
        elif kind == "text":
            parts.append(TextPart(_text(part, at), extra=_rest(part, "text")))
        elif kind in ("inlineData", "fileData"):
            parts.append(_image(part, kind, at))
        elif kind == "functionResponse":
            flush()
            out.append(_function_response(part, at, calls, index))
        else:
            raise UnsupportedContent(
                f"{at}: part kind {kind!r} is not supported in a user turn", param=at
            )
    flush()
    if not out:  # an empty part list is still a turn
        out.append(Message(role=role, extra={"wire_index": index}))
    first = out[0]
    out[0] = Message(
        role=first.role,
        parts=first.parts,
        name=first.name,
        tool_call_id=first.tool_call_id,
        is_error=first.is_error,
        extra={**first.extra, "wire": wire},
    )
    return out


def _system(content: Content | None) -> list[Message]:
    if content is None:
        return []
    parts: list[Part] = []
    for j, part in enumerate(content.parts):
        at = f"systemInstruction.parts[{j}]"
        if _part_kind(part, at) != "text":
            raise UnsupportedContent(f"{at}: only text parts are supported in a system instruction")
        parts.append(TextPart(_text(part, at), extra=_rest(part, "text")))
    wire = {**(content.model_extra or {}), **({"role": content.role} if content.role else {})}
    return [Message(role=Role.SYSTEM, parts=tuple(parts), extra={"source": "system", "wire": wire})]


def _tools(tools: list[Tool] | None) -> tuple[list[ToolSpec], list[dict[str, Any]]]:
    """The function declarations as tools, and each wire tool's own keys."""
    specs: list[ToolSpec] = []
    skeleton: list[dict[str, Any]] = []
    for i, tool in enumerate(tools or ()):
        for key in tool.model_extra or {}:
            raise UnsupportedContent(
                f"tools[{i}]: {key!r} is a {_SERVER_TOOLS}", param=f"tools[{i}].{key}"
            )
        declarations = tool.functionDeclarations
        skeleton.append({"declarations": None if declarations is None else len(declarations)})
        for declaration in declarations or ():
            wire = declaration.model_dump(exclude_unset=True)
            if declaration.parametersJsonSchema is not None:
                parameters, form = declaration.parametersJsonSchema, "json"
            elif declaration.parameters is not None:
                parameters, form = json_schema(declaration.parameters), "openapi"
            else:
                parameters, form = {}, "none"
            specs.append(
                ToolSpec(
                    name=declaration.name,
                    description=declaration.description,
                    parameters=parameters,
                    extra={
                        "form": form,
                        "wire": _rest(wire, "name", "description", "parametersJsonSchema"),
                    },
                )
            )
    return specs, skeleton


def _tool_choice(config: ToolConfig | None, tools: list[ToolSpec]) -> ToolChoice | None:
    calling = config.functionCallingConfig if config is not None else None
    if calling is None or calling.mode in (None, "MODE_UNSPECIFIED", "AUTO", "VALIDATED"):
        return None if calling is None or calling.mode is None else ToolChoice(ToolChoiceMode.AUTO)
    if calling.mode == "NONE":
        return ToolChoice(ToolChoiceMode.NONE)
    allowed = calling.allowedFunctionNames or []
    names = {t.name for t in tools}
    for name in allowed:
        if name not in names:
            raise InvalidRequest(
                f"toolConfig.functionCallingConfig.allowedFunctionNames: {name!r} is not "
                "among the function declarations",
                param="toolConfig.functionCallingConfig.allowedFunctionNames",
            )
    if len(allowed) == 1:
        return ToolChoice(ToolChoiceMode.NAMED, name=allowed[0])
    return ToolChoice(ToolChoiceMode.REQUIRED)


def _response_format(config: GenerationConfig) -> dict[str, Any] | None:
    mime = config.responseMimeType
    if mime in (None, "text/plain"):
        if config.responseJsonSchema is not None or config.responseSchema is not None:
            raise InvalidRequest(
                "generationConfig: a response schema needs responseMimeType 'application/json'",
                param="generationConfig.responseMimeType",
            )
        return None
    if mime != "application/json":
        raise UnsupportedContent(
            f"generationConfig.responseMimeType: {mime!r} is not supported "
            "(text/plain or application/json)",
            param="generationConfig.responseMimeType",
        )
    if config.responseJsonSchema is not None:
        schema = config.responseJsonSchema
    elif config.responseSchema is not None:
        schema = json_schema(config.responseSchema)
    else:
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}


def request_to_ir(wire: GenerateContentRequest, *, stream: bool) -> ChatRequest:
    """A ``generateContent`` (``stream=False``) or ``streamGenerateContent`` request."""
    calls = _Calls()
    messages = [m for i, content in enumerate(wire.contents) for m in _messages(content, i, calls)]
    tools, skeleton = _tools(wire.tools)
    config = wire.generationConfig or GenerationConfig()
    if config.candidateCount is not None and config.candidateCount > 1:
        raise UnsupportedContent(
            "generationConfig.candidateCount: the gateway samples one candidate per call",
            param="generationConfig.candidateCount",
        )
    generation = config.model_dump(exclude_unset=True)
    extra = unmodeled_fields(wire, _MODELED)
    if skeleton:
        extra["_tools"] = skeleton
    if wire.toolConfig is not None:
        extra["_tool_config"] = wire.toolConfig.model_dump(exclude_unset=True)
    if wire.generationConfig is not None:
        extra["_generation"] = {
            k: v for k, v in generation.items() if k not in _SAMPLING_KEYS and k != "stopSequences"
        }
        extra["_generation_stop"] = "stopSequences" in generation
    thinking = config.thinkingConfig
    kwargs = (
        {"enable_thinking": False} if thinking is not None and thinking.thinkingBudget == 0 else {}
    )
    return ChatRequest(
        model=wire.model,
        messages=tuple(_system(wire.systemInstruction) + messages),
        tools=tuple(tools),
        tool_choice=_tool_choice(wire.toolConfig, tools),
        sampling=Sampling(
            max_tokens=config.maxOutputTokens,
            temperature=config.temperature,
            top_p=config.topP,
            top_k=config.topK,
            seed=config.seed,
            presence_penalty=config.presencePenalty,
            frequency_penalty=config.frequencyPenalty,
            stop=tuple(config.stopSequences or ()),
        ),
        stream=stream,
        include_usage=True,
        top_logprobs=(config.logprobs or 0) if config.responseLogprobs else None,
        template_kwargs=kwargs,
        response_format=_response_format(config),
        extra=extra,
    )


def shows_thoughts(request: ChatRequest) -> bool:
    """Whether the client asked for thought parts in replies (``includeThoughts``)."""
    generation = request.extra.get("_generation") or {}
    thinking = generation.get("thinkingConfig")
    return isinstance(thinking, dict) and thinking.get("includeThoughts") is True


# ---------------------------------------------------------------- back to the wire


def _part_json(part: Part) -> dict[str, Any]:
    match part:
        case TextPart(text=text, extra=extra):
            return {"text": text, **extra}
        case ImagePart(url=url, extra=extra):
            kind = extra["kind"]
            value = url.partition(";base64,")[2] if kind == "inlineData" else url
            field = "data" if kind == "inlineData" else "fileUri"
            data = {"mimeType": extra["mime"], field: value, **extra["data"]}
            return {kind: data, **extra["part"]}
        case ReasoningPart(text=text, signature=signature, extra=extra):
            out: dict[str, Any] = {"text": text, "thought": True, **extra}
            if signature is not None:
                out["thoughtSignature"] = signature
            return out
        case ToolCall(id=call_id, name=name, arguments=arguments, extra=extra):
            call: dict[str, Any] = {"name": name, **extra["call"]}
            if extra["id_given"]:
                call["id"] = call_id
            if extra["args_given"]:
                call["args"] = json.loads(arguments)
            return {"functionCall": call, **extra["part"]}
        case _:
            assert_never(part)


def _response_part(message: Message) -> dict[str, Any]:
    extra = message.extra
    response: dict[str, Any] = {"name": message.name, **extra["call"]}
    if extra["id_given"]:
        response["id"] = message.tool_call_id
    if extra["response_given"]:
        form = extra["form"]
        response["response"] = json.loads(message.text) if form == "json" else {form: message.text}
    return {"functionResponse": response, **extra["part"]}


def request_from_ir(request: ChatRequest) -> dict[str, Any]:
    """The Gemini body a :func:`request_to_ir` result came from (``model`` included)."""
    extra = dict(request.extra)
    skeleton = extra.pop("_tools", None)
    tool_config = extra.pop("_tool_config", None)
    generation = extra.pop("_generation", None)
    stop_given = extra.pop("_generation_stop", False)
    body: dict[str, Any] = {"model": request.model}
    messages = list(request.messages)
    if messages and messages[0].extra.get("source") == "system":
        first = messages.pop(0)
        body["systemInstruction"] = {
            "parts": [_part_json(p) for p in first.parts],
            **first.extra["wire"],
        }
    contents: list[dict[str, Any]] = []
    current: int | None = None
    for message in messages:
        index = message.extra["wire_index"]
        if index != current:
            contents.append({"parts": [], **message.extra.get("wire", {})})
            current = index
        target = contents[-1]["parts"]
        if message.role is Role.TOOL:
            target.append(_response_part(message))
        else:
            target.extend(_part_json(p) for p in message.parts)
    body["contents"] = contents
    if skeleton is not None:
        tools: list[dict[str, Any]] = []
        specs = iter(request.tools)
        for tool in skeleton:
            count = tool["declarations"]
            if count is None:
                tools.append({})
                continue
            declarations = []
            for _ in range(count):
                spec = next(specs)
                declaration: dict[str, Any] = {"name": spec.name}
                if spec.description is not None:
                    declaration["description"] = spec.description
                if spec.extra["form"] == "json":
                    declaration["parametersJsonSchema"] = dict(spec.parameters)
                declaration.update(spec.extra["wire"])
                declarations.append(declaration)
            tools.append({"functionDeclarations": declarations})
        body["tools"] = tools
    if tool_config is not None:
        body["toolConfig"] = tool_config
    if generation is not None:
        config = dict(generation)
        for key, field in _SAMPLING_KEYS.items():
            value = getattr(request.sampling, field)
            if value is not None:
                config[key] = value
        if stop_given:
            config["stopSequences"] = list(request.sampling.stop)
        body["generationConfig"] = config
    body.update(extra)
    return body


# ---------------------------------------------------------------- replies


def finish_reason(reason: FinishReason) -> str:
    match reason:
        case FinishReason.STOP | FinishReason.TOOL_CALLS:
            return "STOP"
        case FinishReason.LENGTH:
            return "MAX_TOKENS"
        case FinishReason.CONTENT_FILTER:
            return "SAFETY"
        case FinishReason.ABORT:
            return "OTHER"
        case _:
            assert_never(reason)


def usage_json(usage: Usage) -> dict[str, int]:
    thoughts = usage.reasoning_tokens or 0
    out = {
        "promptTokenCount": usage.prompt_tokens,
        "candidatesTokenCount": usage.completion_tokens - thoughts,
        "totalTokenCount": usage.prompt_tokens + usage.completion_tokens,
    }
    if thoughts:
        out["thoughtsTokenCount"] = thoughts
    if usage.cached_tokens:
        out["cachedContentTokenCount"] = usage.cached_tokens
    return out


def call_args(arguments: str) -> dict[str, Any] | None:
    """A call's arguments as the ``args`` object, or None when they are not one."""
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def function_call_part(name: str, arguments: str) -> dict[str, Any]:
    """A call as a part: ``functionCall``, or its text when the arguments are no object."""
    args = call_args(arguments) if arguments.strip() else {}
    if args is None:
        return {"text": arguments}
    return {"functionCall": {"name": name, "args": args}}


def logprobs_json(details: tuple[TokenLogprob, ...], top: int) -> dict[str, Any]:
    """``logprobsResult``: each sampled token and its alternatives (never token ids)."""
    out: dict[str, Any] = {
        "chosenCandidates": [{"token": d.token, "logProbability": d.logprob} for d in details]
    }
    if top:
        out["topCandidates"] = [
            {"candidates": [{"token": t.token, "logProbability": t.logprob} for t in d.top[:top]]}
            for d in details
        ]
    return out


def candidate_json(
    parts: list[dict[str, Any]],
    *,
    reason: str | None,
    details: tuple[TokenLogprob, ...] | None,
    top: int,
) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if reason is not None:
        candidate["finishReason"] = reason
    if details is not None:
        candidate["logprobsResult"] = logprobs_json(details, top)
        if details:
            candidate["avgLogprobs"] = sum(d.logprob for d in details) / len(details)
    return candidate


def response_json(
    completion: Completion,
    request: ChatRequest,
    *,
    response_id: str,
    details: tuple[TokenLogprob, ...] | None,
) -> dict[str, Any]:
    """The ``GenerateContentResponse`` of a finished call."""
    message = completion.message
    parts: list[dict[str, Any]] = []
    if message.reasoning and shows_thoughts(request):
        parts.append({"text": message.reasoning, "thought": True})
    if message.text.strip():  # whitespace alone is template glue, not a text part
        parts.append({"text": message.text})
    parts.extend(function_call_part(c.name, c.arguments) for c in message.tool_calls)
    return {
        "candidates": [
            candidate_json(
                parts,
                reason=finish_reason(completion.finish_reason),
                details=details,
                top=request.top_logprobs or 0,
            )
        ],
        "usageMetadata": usage_json(completion.usage),
        "modelVersion": model_name(request.model),
        "responseId": response_id,
    }


def error_json(error: ProxyError) -> dict[str, Any]:
    status = ERROR_STATUSES.get(error.status, "UNKNOWN")
    return {"error": {"code": error.status, "message": error.message, "status": status}}
