"""The script a scripted engine replays, and what it expects of each request."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml


class ScriptError(ValueError):
    """A script file or dict that does not describe a valid script."""


@dataclass(frozen=True, slots=True)
class ScriptedCall:
    """A tool call the scripted model makes.

    ``arguments`` as a mapping is written the way a Qwen model writes it
    (``json.dumps`` spacing); as a string it is emitted verbatim, which is how a
    test scripts a malformed call.
    """

    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ObservedRequest:
    """What the engine saw, in the terms an :class:`Expect` checks."""

    messages: Sequence[Mapping[str, Any]] = ()
    tool_names: tuple[str, ...] = ()
    prompt_ids: tuple[int, ...] | None = None
    prompt_text: str | None = None
    """Token-in requests: the decoded prompt (chat requests: None)."""


def _text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


@dataclass(frozen=True, slots=True)
class Expect:
    """Checks on an incoming request; any failure makes the engine fail loudly."""

    last_role: str | None = None
    last_text_contains: str | None = None
    messages: int | None = None
    tools_include: tuple[str, ...] = ()
    system_contains: str | None = None
    """The first message is a system (or developer) message containing this text."""
    prompt_ids: tuple[int, ...] | None = None
    prompt_contains: str | None = None
    prompt_ends_with: str | None = None

    _CHAT_ONLY = ("last_role", "last_text_contains", "messages", "tools_include", "system_contains")

    def problems(self, seen: ObservedRequest) -> list[str]:
        out: list[str] = []
        if seen.prompt_text is not None:
            needs_chat = [name for name in self._CHAT_ONLY if getattr(self, name)]
            if needs_chat:
                return [f"expectations {needs_chat} need a chat request, got token ids"]
            text = seen.prompt_text
            if self.prompt_contains is not None and self.prompt_contains not in text:
                out.append(f"expected the prompt to contain {self.prompt_contains!r}")
            if self.prompt_ends_with is not None and not text.endswith(self.prompt_ends_with):
                out.append(
                    f"expected the prompt to end with {self.prompt_ends_with!r}, "
                    f"got ...{text[-120:]!r}"
                )
        last = seen.messages[-1] if seen.messages else None
        if self.last_role is not None:
            role = last.get("role") if last else None
            if role != self.last_role:
                out.append(f"expected the last message from {self.last_role!r}, got {role!r}")
        if self.last_text_contains is not None:
            text = _text(last) if last else ""
            if self.last_text_contains not in text:
                out.append(
                    f"expected the last message to contain {self.last_text_contains!r}, "
                    f"got {text[:200]!r}"
                )
        if self.system_contains is not None:
            first = seen.messages[0] if seen.messages else {}
            if first.get("role") not in ("system", "developer") or (
                self.system_contains not in _text(first)
            ):
                out.append(f"expected a system message containing {self.system_contains!r}")
        if self.messages is not None and len(seen.messages) != self.messages:
            out.append(f"expected {self.messages} messages, got {len(seen.messages)}")
        missing = [t for t in self.tools_include if t not in seen.tool_names]
        if missing:
            out.append(f"expected tools {missing} to be offered, got {list(seen.tool_names)}")
        if self.prompt_ids is not None:
            got = seen.prompt_ids
            if got != self.prompt_ids:
                where = _first_difference(self.prompt_ids, got or ())
                out.append(
                    f"prompt ids differ from the expected ones at position {where} "
                    f"(expected {len(self.prompt_ids)} ids, got {len(got or ())})"
                )
        return out


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


_EXPECT_FIELDS = {
    "last_role",
    "last_text_contains",
    "messages",
    "tools_include",
    "system_contains",
    "prompt_ids",
    "prompt_contains",
    "prompt_ends_with",
}


def _expect(data: Any, where: str) -> Expect:
    if not isinstance(data, dict):
        raise ScriptError(f"{where}: expected a mapping")
    unknown = set(data) - _EXPECT_FIELDS
    if unknown:
        raise ScriptError(f"{where}: unknown fields {sorted(unknown)}")
    prompt_ids = data.get("prompt_ids")
    return Expect(
        last_role=data.get("last_role"),
        last_text_contains=data.get("last_text_contains"),
        messages=data.get("messages"),
        tools_include=tuple(data.get("tools_include") or ()),
        system_contains=data.get("system_contains"),
        prompt_ids=tuple(prompt_ids) if prompt_ids is not None else None,
        prompt_contains=data.get("prompt_contains"),
        prompt_ends_with=data.get("prompt_ends_with"),
    )


@dataclass(frozen=True, slots=True)
class Turn:
    """One assistant turn the scripted model produces.

    The output is written as a Qwen3 thinking model writes it after the
    ``<think>\\n`` generation prompt: reasoning, ``</think>``, text, tool calls,
    ``<|im_end|>``. ``raw`` replaces all of that with a literal output text.
    ``finish="length"`` cuts the output at ``max_tokens`` (or the request's).
    """

    text: str = ""
    reasoning: str | None = None
    tool_calls: tuple[ScriptedCall, ...] = ()
    raw: str | None = None
    finish: Literal["stop", "length"] = "stop"
    max_tokens: int | None = None
    expect: Expect | None = None
    crash_after: int | None = None
    """Streaming only: drop the connection after this many tokens (an engine crash)."""

    def output_text(self, *, eos: str = "<|im_end|>") -> str:
        if self.raw is not None:
            return self.raw
        out = (self.reasoning or "").strip("\n") + "\n</think>\n\n" + self.text
        for i, call in enumerate(self.tool_calls):
            if i > 0 or self.text:
                out += "\n"
            # A Qwen model writes JSON with Python's default spacing.
            arguments = (
                call.arguments
                if isinstance(call.arguments, str)
                else json.dumps(dict(call.arguments), ensure_ascii=False)
            )
            out += f'<tool_call>\n{{"name": "{call.name}", "arguments": {arguments}}}\n</tool_call>'
        return out + eos


_TURN_FIELDS = {
    "text",
    "reasoning",
    "tool_calls",
    "raw",
    "finish",
    "max_tokens",
    "expect",
    "crash_after",
}


def _turn(raw: Any, where: str) -> Turn:
    if not isinstance(raw, dict):
        raise ScriptError(f"{where}: expected a mapping")
    unknown = set(raw) - _TURN_FIELDS
    if unknown:
        raise ScriptError(f"{where}: unknown fields {sorted(unknown)}")
    calls = []
    for j, call in enumerate(raw.get("tool_calls") or ()):
        if not isinstance(call, dict) or "name" not in call:
            raise ScriptError(f"{where}.tool_calls[{j}]: needs a 'name'")
        calls.append(ScriptedCall(name=call["name"], arguments=call.get("arguments", {})))
    if raw.get("finish", "stop") not in ("stop", "length"):
        raise ScriptError(f"{where}.finish: must be 'stop' or 'length'")
    expect = raw.get("expect")
    return Turn(
        text=str(raw.get("text", "")),
        reasoning=raw.get("reasoning"),
        tool_calls=tuple(calls),
        raw=raw.get("raw"),
        finish=raw.get("finish", "stop"),
        max_tokens=raw.get("max_tokens"),
        crash_after=raw.get("crash_after"),
        expect=_expect(expect, f"{where}.expect") if expect else None,
    )


@dataclass(frozen=True, slots=True)
class SideReply:
    """A reply to any request matching ``when``, outside the main script: side
    calls such as a harness's title generation. It answers any number of times."""

    when: Expect
    turn: Turn


@dataclass(frozen=True, slots=True)
class Script:
    turns: tuple[Turn, ...]
    cycle: bool = False
    """Replay the turns forever (load tests) instead of failing when they run out."""
    side: tuple[SideReply, ...] = ()
    session: re.Pattern[str] | None = None
    """Per-session scripts: serve every session whose id this matches (``re.search``)."""

    def side_reply(self, seen: ObservedRequest) -> Turn | None:
        for rule in self.side:
            if not rule.when.problems(seen):
                return rule.turn
        return None

    @classmethod
    def from_dict(cls, data: Any) -> Script:
        if not isinstance(data, dict) or not isinstance(data.get("turns"), list):
            raise ScriptError("a script is a mapping with a 'turns' list")
        unknown = set(data) - {"turns", "cycle", "side", "session"}
        if unknown:
            raise ScriptError(f"unknown fields {sorted(unknown)}")
        session = None
        if data.get("session") is not None:
            if not isinstance(data["session"], str):
                raise ScriptError("session: expected a regular expression")
            try:
                session = re.compile(data["session"])
            except re.error as exc:
                raise ScriptError(f"session: not a regular expression ({exc})") from None
        turns = tuple(_turn(raw, f"turns[{i}]") for i, raw in enumerate(data["turns"]))
        side = []
        for i, raw in enumerate(data.get("side") or ()):
            if not isinstance(raw, dict) or "when" not in raw:
                raise ScriptError(f"side[{i}]: needs a 'when' mapping")
            body = {k: v for k, v in raw.items() if k != "when"}
            side.append(
                SideReply(
                    when=_expect(raw["when"], f"side[{i}].when"), turn=_turn(body, f"side[{i}]")
                )
            )
        return cls(
            turns=turns, cycle=bool(data.get("cycle", False)), side=tuple(side), session=session
        )


@dataclass(frozen=True, slots=True)
class SessionScripts:
    """One script per session, for engines serving several sessions at once.

    The first request of a session (named by the gateway's ``x-polar-session``
    header) takes the first script whose ``session`` pattern matches the
    session's id (such a script serves any number of sessions, each from its
    first turn), or else the next unused script without a pattern, in order;
    that session's later requests follow it. A request without the header, or
    of a session no script is left for, is a mismatch.
    """

    scripts: tuple[Script, ...]

    @classmethod
    def from_dict(cls, data: Any) -> SessionScripts:
        if not isinstance(data, dict) or not isinstance(data.get("sessions"), list):
            raise ScriptError("per-session scripts are a mapping with a 'sessions' list")
        unknown = set(data) - {"sessions"}
        if unknown:
            raise ScriptError(f"unknown fields {sorted(unknown)}")
        scripts = []
        for i, raw in enumerate(data["sessions"]):
            try:
                scripts.append(Script.from_dict(raw))
            except ScriptError as exc:
                raise ScriptError(f"sessions[{i}]: {exc}") from None
        if not scripts:
            raise ScriptError("'sessions' is empty")
        return cls(tuple(scripts))


def script_from_dict(data: Any) -> Script | SessionScripts:
    """A script (``{turns: ...}``) or per-session scripts (``{sessions: [...]}``)."""
    if isinstance(data, dict) and "sessions" in data:
        return SessionScripts.from_dict(data)
    return Script.from_dict(data)


def load_script(path: Path) -> Script | SessionScripts:
    """Read a script file (YAML or JSON)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScriptError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        raise ScriptError(f"{path}: not valid YAML or JSON") from None
    try:
        return script_from_dict(data)
    except ScriptError as exc:
        raise ScriptError(f"{path}: {exc}") from None
