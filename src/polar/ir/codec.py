"""Plain-JSON forms of the IR types, for storage and for exports such as JSONL.

``to_json`` functions return values ``json``/``orjson`` can serialise;
``from_json`` functions validate shape and raise ``ValueError`` with the path
of the first problem.
"""

from __future__ import annotations

from typing import Any, assert_never

from polar.ir.behaviour import SHAPING, Behaviour, Distribution, LogprobSource
from polar.ir.completion import FinishReason, Usage
from polar.ir.messages import (
    EditKind,
    ImagePart,
    Message,
    Part,
    ReasoningPart,
    RequestEdit,
    Role,
    Sampling,
    TextPart,
    ToolCall,
)
from polar.ir.records import (
    CallError,
    CaptureMode,
    CompletionRecord,
    DeliveryFlag,
    DeliveryIssue,
    Dialect,
    ErrorKind,
    MalformedToolCall,
    PromptLineage,
    PromptOrigin,
    RecordStatus,
    Timings,
)


def part_to_json(part: Part) -> dict[str, Any]:
    match part:
        case TextPart(text=text):
            return {"kind": "text", "text": text}
        case ImagePart(url=url, detail=detail):
            return {"kind": "image", "url": url, "detail": detail}
        case ReasoningPart(text=text, signature=signature):
            return {"kind": "reasoning", "text": text, "signature": signature}
        case ToolCall(id=call_id, name=name, arguments=arguments):
            return {"kind": "tool_call", "id": call_id, "name": name, "arguments": arguments}
        case _:
            assert_never(part)


def part_from_json(data: Any, path: str = "part") -> Part:
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected an object")
    kind = data.get("kind")
    try:
        if kind == "text":
            return TextPart(text=str(data["text"]))
        if kind == "image":
            return ImagePart(url=str(data["url"]), detail=data.get("detail"))
        if kind == "reasoning":
            return ReasoningPart(text=str(data["text"]), signature=data.get("signature"))
        if kind == "tool_call":
            return ToolCall(
                id=str(data["id"]), name=str(data["name"]), arguments=str(data["arguments"])
            )
    except KeyError as exc:
        raise ValueError(f"{path}: missing field {exc.args[0]!r}") from None
    raise ValueError(f"{path}: unknown part kind {kind!r}")


def message_to_json(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {
        "role": message.role.value,
        "parts": [part_to_json(p) for p in message.parts],
    }
    if message.name is not None:
        out["name"] = message.name
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.is_error:
        out["is_error"] = True
    return out


def message_from_json(data: Any, path: str = "message") -> Message:
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected an object")
    try:
        role = Role(data["role"])
    except (KeyError, ValueError):
        raise ValueError(f"{path}.role: expected one of {[r.value for r in Role]}") from None
    parts = data.get("parts", [])
    if not isinstance(parts, list):
        raise ValueError(f"{path}.parts: expected a list")
    return Message(
        role=role,
        parts=tuple(part_from_json(p, f"{path}.parts[{i}]") for i, p in enumerate(parts)),
        name=data.get("name"),
        tool_call_id=data.get("tool_call_id"),
        is_error=bool(data.get("is_error", False)),
    )


def usage_to_json(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cached_tokens": usage.cached_tokens,
        "reasoning_tokens": usage.reasoning_tokens,
    }


def usage_from_json(data: Any) -> Usage:
    if not isinstance(data, dict):
        raise ValueError("usage: expected an object")
    return Usage(
        prompt_tokens=int(data["prompt_tokens"]),
        completion_tokens=int(data["completion_tokens"]),
        cached_tokens=data.get("cached_tokens"),
        reasoning_tokens=data.get("reasoning_tokens"),
    )


def lineage_to_json(lineage: PromptLineage) -> dict[str, Any]:
    return {
        "origin": lineage.origin.value,
        "base_seq": lineage.base_seq,
        "base_attempt": lineage.base_attempt,
        "shared_tokens": lineage.shared_tokens,
        "base_tokens": lineage.base_tokens,
        "spliced": lineage.spliced,
    }


def lineage_from_json(data: Any) -> PromptLineage:
    if not isinstance(data, dict):
        raise ValueError("lineage: expected an object")
    return PromptLineage(
        origin=PromptOrigin(data["origin"]),
        base_seq=data.get("base_seq"),
        base_attempt=data.get("base_attempt"),
        shared_tokens=int(data.get("shared_tokens", 0)),
        base_tokens=int(data.get("base_tokens", 0)),
        spliced=bool(data.get("spliced", False)),
    )


def record_to_json(record: CompletionRecord) -> dict[str, Any]:
    """The full record as one JSON object (the ``polar records --format jsonl`` row)."""
    return {
        "session_id": record.session_id,
        "seq": record.seq,
        "attempt": record.attempt,
        "status": record.status.value,
        "dialect": record.dialect.value,
        "capture": record.capture.value,
        "engine": record.engine,
        "model": record.model,
        "policy_version": record.policy_version,
        "stream": record.stream,
        "finish_reason": record.finish_reason.value if record.finish_reason else None,
        "prompt_ids": list(record.prompt_ids),
        "output_ids": list(record.output_ids),
        "output_logprobs": list(record.output_logprobs),
        "message": message_to_json(record.message) if record.message else None,
        "usage": usage_to_json(record.usage) if record.usage else None,
        "timings": {
            "arrived": record.timings.arrived,
            "engine_started": record.timings.engine_started,
            "first_token": record.timings.first_token,
            "finished": record.timings.finished,
        },
        "error": (
            {
                "kind": record.error.kind.value,
                "message": record.error.message,
                "status": record.error.status,
            }
            if record.error
            else None
        ),
        "lineage": lineage_to_json(record.lineage) if record.lineage else None,
        "malformed_tool_calls": [
            {"raw": m.raw, "reason": m.reason} for m in record.malformed_tool_calls
        ],
        "edits": [{"kind": e.kind.value, "detail": e.detail} for e in record.edits],
        "delivery_flags": delivery_flags_to_json(record.delivery_flags),
        "behaviour": behaviour_to_json(record.behaviour) if record.behaviour else None,
        "original_request": record.original_request,
        "engine_request": record.engine_request,
    }


def delivery_flags_to_json(flags: tuple[DeliveryFlag, ...]) -> list[dict[str, str]]:
    return [{"issue": f.issue.value, "detail": f.detail} for f in flags]


def delivery_flags_from_json(data: Any) -> tuple[DeliveryFlag, ...]:
    return tuple(
        DeliveryFlag(issue=DeliveryIssue(f["issue"]), detail=str(f["detail"])) for f in data
    )


def record_from_json(data: Any) -> CompletionRecord:
    """Inverse of :func:`record_to_json`."""
    if not isinstance(data, dict):
        raise ValueError("record: expected an object")
    try:
        timings = data["timings"]
        error = data.get("error")
        return CompletionRecord(
            session_id=str(data["session_id"]),
            seq=int(data["seq"]),
            attempt=int(data["attempt"]),
            status=RecordStatus(data["status"]),
            dialect=Dialect(data["dialect"]),
            capture=CaptureMode(data["capture"]),
            engine=str(data["engine"]),
            model=str(data["model"]),
            policy_version=int(data["policy_version"]),
            stream=bool(data["stream"]),
            original_request=data["original_request"],
            engine_request=data["engine_request"],
            timings=Timings(
                arrived=float(timings["arrived"]),
                engine_started=timings.get("engine_started"),
                first_token=timings.get("first_token"),
                finished=timings.get("finished"),
            ),
            prompt_ids=tuple(int(i) for i in data.get("prompt_ids", ())),
            output_ids=tuple(int(i) for i in data.get("output_ids", ())),
            output_logprobs=tuple(float(x) for x in data.get("output_logprobs", ())),
            finish_reason=FinishReason(data["finish_reason"])
            if data.get("finish_reason")
            else None,
            message=message_from_json(data["message"]) if data.get("message") else None,
            usage=usage_from_json(data["usage"]) if data.get("usage") else None,
            error=(
                CallError(
                    kind=ErrorKind(error["kind"]),
                    message=str(error["message"]),
                    status=error.get("status"),
                )
                if error
                else None
            ),
            lineage=lineage_from_json(data["lineage"]) if data.get("lineage") else None,
            malformed_tool_calls=tuple(
                MalformedToolCall(raw=str(m["raw"]), reason=str(m["reason"]))
                for m in data.get("malformed_tool_calls") or ()
            ),
            edits=tuple(
                RequestEdit(kind=EditKind(e["kind"]), detail=str(e["detail"]))
                for e in data.get("edits") or ()
            ),
            delivery_flags=delivery_flags_from_json(data.get("delivery_flags") or ()),
            behaviour=behaviour_from_json(data["behaviour"]) if data.get("behaviour") else None,
        )
    except KeyError as exc:
        raise ValueError(f"record: missing field {exc.args[0]!r}") from None


# ---------------------------------------------------------------- sampling behaviour

_SAMPLING_FIELDS = ("max_tokens", *SHAPING, "seed")


def sampling_to_json(sampling: Sampling) -> dict[str, Any]:
    """Every setting, ``None`` included (``None``: left to the engine's default)."""
    out: dict[str, Any] = {name: getattr(sampling, name) for name in _SAMPLING_FIELDS}
    out["stop"] = list(sampling.stop)
    out["logit_bias"] = {str(k): v for k, v in sampling.logit_bias.items()}
    return out


def sampling_from_json(data: Any) -> Sampling:
    if not isinstance(data, dict):
        raise ValueError("sampling: expected an object")
    ints = {"max_tokens", "top_k", "seed"}
    values: dict[str, Any] = {}
    for name in _SAMPLING_FIELDS:
        value = data.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"sampling.{name}: expected a number, got {value!r}")
            value = int(value) if name in ints else float(value)
        values[name] = value
    return Sampling(
        **values,
        stop=tuple(str(s) for s in data.get("stop") or ()),
        logit_bias={int(k): float(v) for k, v in (data.get("logit_bias") or {}).items()},
    )


def behaviour_to_json(behaviour: Behaviour) -> dict[str, Any]:
    return {
        "sampling": sampling_to_json(behaviour.sampling),
        "logprobs": behaviour.logprobs.value,
        "constrained": behaviour.constrained,
        "enforced": behaviour.enforced,
    }


def behaviour_from_json(data: Any) -> Behaviour:
    if not isinstance(data, dict):
        raise ValueError("behaviour: expected an object")
    return Behaviour(
        sampling=sampling_from_json(data.get("sampling")),
        logprobs=LogprobSource(data["logprobs"]),
        constrained=bool(data.get("constrained", False)),
        enforced=bool(data.get("enforced", False)),
    )


def distribution_to_json(dist: Distribution) -> dict[str, Any]:
    return {
        "temperature": dist.temperature,
        "top_p": dist.top_p,
        "top_k": dist.top_k,
        "min_p": dist.min_p,
    }


def distribution_from_json(data: Any) -> Distribution:
    """Raises ``ValueError`` naming the problem (a missing or out-of-range setting)."""
    if not isinstance(data, dict):
        raise ValueError("sampling: expected an object")
    unknown = sorted(set(data) - {"temperature", "top_p", "top_k", "min_p"})
    if unknown:
        raise ValueError(f"sampling: unknown setting {unknown[0]!r}")
    top_k = data.get("top_k", 0)
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise ValueError(f"sampling.top_k: expected an integer, got {top_k!r}")
    numbers = {}
    for name, default in (("temperature", 1.0), ("top_p", 1.0), ("min_p", 0.0)):
        value = data.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"sampling.{name}: expected a number, got {value!r}")
        numbers[name] = float(value)
    return Distribution(top_k=top_k, **numbers)
