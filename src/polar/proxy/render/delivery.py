"""Engine-rendered capture: what the client receives is derived from the sampled ids.

vLLM's and SGLang's chat routes parse reasoning and tool calls themselves, and
their parsers do not always say what the model wrote: vLLM 0.32's streaming
hermes parser sends nothing of a turn after a ``<tool_call>`` that does not
close, its non-streaming route strips a stray ``</think>``, a call with no
``arguments`` comes out with ``{}``, and streamed argument pieces need not join
to valid JSON. So the gateway does not relay the engine's parse: it decodes the
sampled ids the engine reports and runs its own parser over them (the same one
token-in/token-out capture uses), and hands the client that. The engine's parse
is kept only to be compared with the sampled text; every disagreement, and
every well-formed oddity of the sampled call itself (a tool that was not
offered, missing arguments), becomes a :class:`~polar.ir.DeliveryFlag` on the
record, counted by the trajectory builders' accounting.

Comparisons are made with whitespace collapsed: the engine's parsers and the
gateway's both trim the glue around tool calls, differently.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field

from polar.ir import (
    DeliveryFlag,
    DeliveryIssue,
    Delta,
    EngineEvent,
    Finish,
    FinishReason,
    MalformedToolCall,
    PromptTokens,
    ToolCallDelta,
    ToolSpec,
)
from polar.proxy.render.parse import OutputParser, ParserOptions, Piece
from polar.proxy.render.tokens import TokenText

# Prompt tokens decoded to find out whether the prompt leaves a <think> block open.
_PROMPT_TAIL_TOKENS = 32
_CLIP = 200


def _clip(text: str) -> str:
    return text if len(text) <= _CLIP else text[: _CLIP - 3] + "..."


def _squash(text: str) -> str:
    return " ".join(text.split())


@dataclass(slots=True)
class ParsedTurn:
    """A turn's text, reasoning and tool calls (name, arguments text), accumulated
    from deltas; calls withdrawn by a ``discard`` delta are dropped."""

    text: str = ""
    reasoning: str = ""
    calls: dict[int, list[str]] = field(default_factory=dict)
    discarded: set[int] = field(default_factory=set)

    def add(self, text: str, reasoning: str, calls: Sequence[ToolCallDelta]) -> None:
        self.text += text
        self.reasoning += reasoning
        for delta in calls:
            if delta.discard:
                self.discarded.add(delta.index)
                continue
            call = self.calls.setdefault(delta.index, ["", ""])
            if delta.name:
                call[0] = delta.name
            call[1] += delta.arguments

    def tool_calls(self) -> list[tuple[str, str]]:
        return [
            (name, arguments)
            for index, (name, arguments) in sorted(self.calls.items())
            if index not in self.discarded
        ]


def _arguments_value(text: str) -> object:
    try:
        return json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        return text


def compare(sampled: ParsedTurn, engine: ParsedTurn, *, streamed: bool) -> list[DeliveryFlag]:
    """Where the engine's parse of a turn differs from the gateway's parse of the
    same sampled ids."""
    flags: list[DeliveryFlag] = []
    for what, ours, theirs in (
        ("text", sampled.text, engine.text),
        ("reasoning", sampled.reasoning, engine.reasoning),
    ):
        if _squash(ours) != _squash(theirs):
            flags.append(
                DeliveryFlag(
                    DeliveryIssue.ENGINE_TEXT_DIFFERS,
                    f"{what}: sampled {_clip(ours)!r}, engine gave {_clip(theirs)!r}",
                )
            )
    engine_calls = engine.tool_calls()
    for name, arguments in engine_calls:
        try:
            json.loads(arguments)
        except json.JSONDecodeError:
            how = "streamed pieces join to" if streamed else "arguments are"
            flags.append(
                DeliveryFlag(
                    DeliveryIssue.ENGINE_ARGUMENTS_NOT_JSON,
                    f"{name}: {how} {_clip(arguments)!r}",
                )
            )
    ours_calls = [(n, _arguments_value(a)) for n, a in sampled.tool_calls()]
    theirs_calls = [(n, _arguments_value(a)) for n, a in engine_calls]
    if ours_calls != theirs_calls:
        flags.append(
            DeliveryFlag(
                DeliveryIssue.ENGINE_TOOL_CALLS_DIFFER,
                f"sampled {_clip(repr(ours_calls))}, engine gave {_clip(repr(theirs_calls))}",
            )
        )
    return flags


def withdrawn_flags(calls: Sequence[ToolCallDelta], *, streamed: bool) -> list[DeliveryFlag]:
    """A streamed call withdrawn as malformed: the client saw it start as a call."""
    if not streamed:
        return []  # a whole reply is built from the message, which honours the withdrawal
    return [
        DeliveryFlag(DeliveryIssue.STREAMED_CALL_WITHDRAWN, f"tool call {d.index}")
        for d in calls
        if d.discard
    ]


def call_flags(
    turn: ParsedTurn, raw_texts: Sequence[str], tools: Sequence[ToolSpec]
) -> list[DeliveryFlag]:
    """Oddities of well-formed calls the model wrote: a tool that was not offered,
    arguments left out (``raw_texts`` are the calls' bodies as written)."""
    offered = {t.name for t in tools}
    flags = []
    for (name, _), raw in zip(turn.tool_calls(), raw_texts, strict=False):
        if tools and name not in offered:
            flags.append(DeliveryFlag(DeliveryIssue.TOOL_NOT_OFFERED, f"{_clip(name)!r}"))
        try:
            body = json.loads(raw)
        except json.JSONDecodeError:
            continue
        if isinstance(body, dict) and "arguments" not in body and "parameters" not in body:
            flags.append(
                DeliveryFlag(DeliveryIssue.ARGUMENTS_MISSING, f"{_clip(name)!r}: {_clip(raw)!r}")
            )
    return flags


class Redelivery:
    """Rewrites one engine call's events: each ``Delta`` keeps its ids and
    logprobs, and its text, reasoning and tool calls become the gateway's parse
    of those ids. :attr:`flags` and :attr:`malformed` are complete once the
    ``Finish`` event has been yielded."""

    def __init__(
        self,
        text: TokenText,
        options: ParserOptions,
        *,
        tools: Sequence[ToolSpec],
        stop_ids: Sequence[int],
        streamed: bool,
    ) -> None:
        self._text = text
        self._options = options
        self._tools = tuple(tools)
        self._stops = frozenset(stop_ids)
        self._streamed = streamed
        self.flags: list[DeliveryFlag] = []
        self.malformed: list[MalformedToolCall] = []

    def _parser(self, prompt_ids: Sequence[int]) -> OutputParser:
        opt = self._options
        tail = self._text.decode(prompt_ids[-_PROMPT_TAIL_TOKENS:])
        in_reasoning = opt.reasoning and tail.rfind(opt.think_start) > tail.rfind(opt.think_end)
        return OutputParser(opt, tools=self._tools, in_reasoning=in_reasoning)

    async def events(
        self, events: AsyncGenerator[EngineEvent, None]
    ) -> AsyncGenerator[EngineEvent, None]:
        stream = self._text.stream()
        parser = self._parser(())
        sampled, engine = ParsedTurn(), ParsedTurn()
        async with contextlib.aclosing(events):
            async for event in events:
                if isinstance(event, PromptTokens):
                    parser = self._parser(event.ids)
                    yield event
                elif isinstance(event, Delta):
                    engine.add(event.text, event.reasoning, event.tool_calls)
                    visible = [i for i in event.token_ids if i not in self._stops]
                    piece = parser.feed(stream.feed(visible))
                    sampled.add(piece.text, piece.reasoning, piece.tool_calls)
                    self.flags.extend(withdrawn_flags(piece.tool_calls, streamed=self._streamed))
                    yield Delta(
                        token_ids=event.token_ids,
                        logprobs=event.logprobs,
                        text=piece.text,
                        reasoning=piece.reasoning,
                        tool_calls=tuple(piece.tool_calls),
                        details=event.details,
                    )
                else:
                    piece = parser.feed(stream.flush())
                    piece.extend(parser.finish())
                    sampled.add(piece.text, piece.reasoning, piece.tool_calls)
                    self.flags.extend(withdrawn_flags(piece.tool_calls, streamed=self._streamed))
                    self.malformed.extend(parser.malformed)
                    self.flags.extend(compare(sampled, engine, streamed=self._streamed))
                    self.flags.extend(call_flags(sampled, parser.written_calls, self._tools))
                    if _has_content(piece):
                        yield Delta(
                            text=piece.text,
                            reasoning=piece.reasoning,
                            tool_calls=tuple(piece.tool_calls),
                        )
                    yield Finish(
                        reason=_reason(event.reason, bool(sampled.tool_calls())),
                        usage=event.usage,
                        matched_stop=event.matched_stop,
                    )


def _has_content(piece: Piece) -> bool:
    return bool(piece.text or piece.reasoning or piece.tool_calls)


def _reason(engine: FinishReason, has_calls: bool) -> FinishReason:
    """The engine's finish reason, told by the gateway's parse whether calls were made."""
    if has_calls and engine is FinishReason.STOP:
        return FinishReason.TOOL_CALLS
    if not has_calls and engine is FinishReason.TOOL_CALLS:
        return FinishReason.STOP
    return engine
