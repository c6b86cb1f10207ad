"""Sampled text to an assistant message, incrementally: reasoning, text, tool calls.

The gateway parses what the model wrote itself (token-in/token-out capture),
as text arrives, so streamed tool-call deltas reach the client while the model
is still writing them. Two tool-call formats:

* **hermes** (Qwen2.5/Qwen3): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``;
  the arguments text streams as written once the name is known;
* **qwen3_coder**: ``<tool_call><function=NAME><parameter=P>value</parameter>
  </function></tool_call>``; arguments are built as JSON, string values
  streamed as they grow, other values typed by the tool's JSON schema.

Reasoning is the text inside ``<think>...</think>`` (or before ``</think>``
when the prompt opened the block). A tool call that does not parse is returned
to the client as text and reported in :attr:`OutputParser.malformed`, never
dropped. Whitespace between tool calls is template glue and is not shown.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from polar.ir import MalformedToolCall, ToolCallDelta, ToolSpec


class ToolFormat(StrEnum):
    HERMES = "hermes"
    QWEN3_CODER = "qwen3_coder"


@dataclass(frozen=True, slots=True)
class ParserOptions:
    tool_format: ToolFormat = ToolFormat.HERMES
    reasoning: bool = True
    think_start: str = "<think>"
    think_end: str = "</think>"
    tool_start: str = "<tool_call>"
    tool_end: str = "</tool_call>"


@dataclass(slots=True)
class Piece:
    """What one chunk of text added to the message."""

    text: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def extend(self, other: Piece) -> None:
        self.text += other.text
        self.reasoning += other.reasoning
        self.tool_calls.extend(other.tool_calls)


def _holdback(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that could start ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


# ---------------------------------------------------------------- tool-call bodies


class _CallBody:
    """Incremental parser of one tool call's body (text between the tags)."""

    def __init__(self, index: int, make_id: Callable[[], str]) -> None:
        self.index = index
        self.text = ""
        self.announced = False
        self.name = ""
        self.arguments = ""  # arguments text sent so far
        self._make_id = make_id

    def _announce(self, name: str) -> ToolCallDelta:
        self.announced = True
        self.name = name
        return ToolCallDelta(index=self.index, id=self._make_id(), name=name)

    def _args(self, text: str) -> ToolCallDelta:
        self.arguments += text
        return ToolCallDelta(index=self.index, arguments=text)

    def feed(self, text: str) -> list[ToolCallDelta]:
        raise NotImplementedError

    def close(self) -> tuple[list[ToolCallDelta], str | None]:
        """The body is complete: remaining deltas, or the reason it is malformed."""
        raise NotImplementedError


# The name first, then "arguments" and at least one character of its value.
_NAME_FIRST = re.compile(
    r'^\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*(?=\S)'
)


def _json_value_end(text: str) -> int | None:
    """Index just past the JSON value at the start of ``text`` once it is complete."""
    depth = 0
    in_string = False
    escape = False
    started = False
    for i, ch in enumerate(text):
        if in_string:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == '"':
                in_string = False
                if depth == 0:
                    return i + 1
            continue
        if ch.isspace() and not started:
            continue
        started = True
        if ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
            if depth < 0:
                return None
        elif depth == 0 and ch in ",}":
            return i
    return None


class _HermesBody(_CallBody):
    """``{"name": "...", "arguments": {...}}``; arguments stream as written."""

    def __init__(self, index: int, make_id: Callable[[], str]) -> None:
        super().__init__(index, make_id)
        self._args_start: int | None = None

    def feed(self, text: str) -> list[ToolCallDelta]:
        self.text += text
        out: list[ToolCallDelta] = []
        if self._args_start is None:
            match = _NAME_FIRST.match(self.text)
            if match is None:
                return out
            try:
                name = json.loads(match.group(1))
            except json.JSONDecodeError:
                return out
            self._args_start = match.end()
            out.append(self._announce(name))
        raw = self.text[self._args_start :]
        if raw.startswith('"'):
            return out  # arguments given as a JSON string: sent whole once parsed
        end = _json_value_end(raw)
        available = raw if end is None else raw[:end]
        # Hold back a trailing backslash: it may start an escape split across chunks.
        safe = len(available) - (1 if available.endswith("\\") and end is None else 0)
        if safe > len(self.arguments):
            out.append(self._args(available[len(self.arguments) : safe]))
        return out

    def close(self) -> tuple[list[ToolCallDelta], str | None]:
        try:
            parsed = json.loads(self.text)
        except json.JSONDecodeError as exc:
            return [], f"not valid JSON: {exc}"
        if not isinstance(parsed, dict) or not isinstance(parsed.get("name"), str):
            return [], 'expected {"name": <string>, "arguments": <object>}'
        arguments = parsed.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                return [], "arguments is a string that is not JSON"
        if not isinstance(arguments, dict):
            return [], "arguments is not an object"
        out: list[ToolCallDelta] = []
        if not self.announced:
            # Keys in an unusual order: nothing could be streamed; send it whole.
            out.append(self._announce(parsed["name"]))
            out.append(self._args(json.dumps(arguments, ensure_ascii=False)))
            return out, None
        assert self._args_start is not None
        raw = self.text[self._args_start :]
        end = _json_value_end(raw)
        full = raw[:end] if end is not None else raw.rstrip().removesuffix("}").rstrip()
        if isinstance(parsed.get("arguments"), str):
            full = parsed["arguments"]
        if not full.startswith(self.arguments):
            return out, "arguments changed while streaming"
        if len(full) > len(self.arguments):
            out.append(self._args(full[len(self.arguments) :]))
        return out, None


_FUNCTION = re.compile(r"<function=([^>\n]+)>")
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>")


class _XmlBody(_CallBody):
    """``<function=NAME><parameter=P>value</parameter></function>``, built into JSON."""

    def __init__(
        self, index: int, make_id: Callable[[], str], schemas: dict[str, dict[str, Any]]
    ) -> None:
        super().__init__(index, make_id)
        self._schemas = schemas
        self._pos = 0  # how far self.text has been consumed
        self._param: str | None = None  # open parameter name
        self._value = ""  # its value so far (string parameters: what was streamed)
        self._streaming_string = False
        self._params = 0
        self._closed = False

    def _type_of(self, param: str) -> str:
        props = (self._schemas.get(self.name) or {}).get("properties") or {}
        kind = (props.get(param) or {}).get("type", "string")
        return kind if isinstance(kind, str) else "string"

    def feed(self, text: str) -> list[ToolCallDelta]:
        self.text += text
        out: list[ToolCallDelta] = []
        while not self._closed:
            rest = self.text[self._pos :]
            if not self.announced:
                match = _FUNCTION.search(rest)
                if match is None:
                    return out
                self._pos += match.end()
                out.append(self._announce(match.group(1).strip()))
                continue
            if self._param is None:
                opened = _PARAMETER.search(rest)
                closing = rest.find("</function>")
                if opened is not None and (closing < 0 or opened.start() < closing):
                    if len(rest) == opened.end():
                        return out  # the newline after the tag may still come
                    self._param = opened.group(1).strip()
                    self._pos += opened.end()
                    if rest[opened.end() :].startswith("\n"):
                        self._pos += 1
                    prefix = "{" if self._params == 0 else ", "
                    self._params += 1
                    self._streaming_string = self._type_of(self._param) == "string"
                    self._value = ""
                    if self._streaming_string:
                        out.append(self._args(f'{prefix}{json.dumps(self._param)}: "'))
                    else:
                        out.append(self._args(f"{prefix}{json.dumps(self._param)}: "))
                    continue
                if closing >= 0:
                    self._pos += closing + len("</function>")
                    out.append(self._args("}" if self._params else "{}"))
                    self._closed = True
                return out
            end = rest.find("</parameter>")
            if end < 0:
                if self._streaming_string:
                    keep = _holdback(rest, "\n</parameter>")
                    fresh = rest[: len(rest) - keep]
                    if fresh:
                        self._pos += len(fresh)
                        self._value += fresh
                        out.append(self._args(json.dumps(fresh, ensure_ascii=False)[1:-1]))
                return out
            value = rest[:end]
            self._pos += end + len("</parameter>")
            if self._streaming_string:
                if value.endswith("\n"):
                    value = value[:-1]
                tail = json.dumps(value, ensure_ascii=False)[1:-1] if value else ""
                self._value += value
                out.append(self._args(tail + '"'))
            else:
                if value.endswith("\n"):
                    value = value[:-1]
                out.append(self._args(_typed(value, self._type_of(self._param))))
            self._param = None
        return out

    def close(self) -> tuple[list[ToolCallDelta], str | None]:
        if not self.announced:
            return [], "no <function=...> in the tool call"
        if not self._closed:
            return [], "the function block is not closed"
        return [], None


def _typed(value: str, kind: str) -> str:
    """A parameter value as JSON text, by its schema type."""
    if kind in ("integer", "number", "boolean", "object", "array", "null"):
        try:
            return json.dumps(json.loads(value), ensure_ascii=False)
        except json.JSONDecodeError:
            pass
    return json.dumps(value, ensure_ascii=False)


# ---------------------------------------------------------------- the parser


class _Mode(StrEnum):
    REASONING = "reasoning"
    CONTENT = "content"
    TOOL = "tool"


class OutputParser:
    """Feed text as it is sampled; get pieces of the assistant message."""

    def __init__(
        self,
        options: ParserOptions,
        *,
        tools: Sequence[ToolSpec],
        in_reasoning: bool,
        make_id: Callable[[], str] = new_call_id,
    ) -> None:
        self._opt = options
        self._tools_offered = bool(tools)
        self._schemas = {t.name: dict(t.parameters) for t in tools}
        self._mode = _Mode.REASONING if in_reasoning and options.reasoning else _Mode.CONTENT
        self._pending = ""
        self._seen_output = False
        self._calls = 0
        self._body: _CallBody | None = None
        self._make_id = make_id
        self.malformed: list[MalformedToolCall] = []
        self.written_calls: list[str] = []
        """The bodies (text between the tags) of the calls that parsed, in order."""

    def _new_body(self) -> _CallBody:
        index = self._calls
        self._calls += 1
        if self._opt.tool_format is ToolFormat.QWEN3_CODER:
            return _XmlBody(index, self._make_id, self._schemas)
        return _HermesBody(index, self._make_id)

    def feed(self, text: str) -> Piece:
        self._pending += text
        piece = Piece()
        while self._pending:
            if not self._step(piece):
                break
        return piece

    def _step(self, piece: Piece) -> bool:
        """Consume what can be decided from the pending text; False when it must wait."""
        opt = self._opt
        pending = self._pending
        if self._mode is _Mode.REASONING:
            end = pending.find(opt.think_end)
            if end >= 0:
                piece.reasoning += pending[:end]
                self._pending = pending[end + len(opt.think_end) :]
                self._mode = _Mode.CONTENT
                self._seen_output = True
                return True
            keep = _holdback(pending, opt.think_end)
            piece.reasoning += pending[: len(pending) - keep]
            self._pending = pending[len(pending) - keep :]
            return False
        if self._mode is _Mode.CONTENT:
            if opt.reasoning and not self._seen_output:
                stripped = pending.lstrip()
                if stripped.startswith(opt.think_start):
                    self._pending = stripped[len(opt.think_start) :]
                    self._mode = _Mode.REASONING
                    self._seen_output = True
                    return True
                if opt.think_start.startswith(stripped):
                    return False  # might still become "<think>"
            self._seen_output = True
            start = pending.find(opt.tool_start) if self._tools_offered else -1
            if start >= 0:
                before = pending[:start]
                if self._calls == 0 or before.strip():
                    piece.text += before
                self._pending = pending[start + len(opt.tool_start) :]
                self._mode = _Mode.TOOL
                self._body = self._new_body()
                return True
            keep = _holdback(pending, opt.tool_start) if self._tools_offered else 0
            visible = pending[: len(pending) - keep]
            if self._calls and not visible.strip():
                return False  # whitespace after a call: glue, unless text follows
            piece.text += visible
            self._pending = pending[len(pending) - keep :]
            return False
        body = self._body
        assert body is not None
        end = pending.find(opt.tool_end)
        if end < 0:
            keep = _holdback(pending, opt.tool_end)
            piece.tool_calls += body.feed(pending[: len(pending) - keep])
            self._pending = pending[len(pending) - keep :]
            return False
        piece.tool_calls += body.feed(pending[:end])
        self._pending = pending[end + len(opt.tool_end) :]
        self._close_call(piece, complete=True)
        self._mode = _Mode.CONTENT
        return True

    def _close_call(self, piece: Piece, *, complete: bool) -> None:
        body = self._body
        assert body is not None
        self._body = None
        deltas, problem = body.close() if complete else ([], "the output ended inside the call")
        if problem is None:
            piece.tool_calls += deltas
            self.written_calls.append(body.text)
            return
        opt = self._opt
        raw = opt.tool_start + body.text + (opt.tool_end if complete else "")
        self.malformed.append(MalformedToolCall(raw=raw, reason=problem))
        if body.announced:
            piece.tool_calls.append(ToolCallDelta(index=body.index, discard=True))
        # Returned as text: the client sees exactly what the model wrote.
        piece.text += raw

    def finish(self) -> Piece:
        """The output ended: flush held-back text, close an open tool call."""
        piece = Piece()
        pending, self._pending = self._pending, ""
        if self._mode is _Mode.REASONING:
            piece.reasoning += pending
        elif self._mode is _Mode.CONTENT:
            if self._calls == 0 or pending.strip():
                piece.text += pending
        else:
            assert self._body is not None
            piece.tool_calls += self._body.feed(pending)
            self._close_call(piece, complete=False)
        return piece
