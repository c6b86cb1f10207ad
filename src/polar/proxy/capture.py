"""Capture modes: who renders the prompt and parses the output.

* :class:`EngineRendered`: the engine applies the chat template and parses
  tool calls (vLLM/SGLang chat routes); the gateway records the ids the engine
  reports and measures afterwards how each prompt relates to earlier calls.
* :class:`GatewayRendered` (token-in/token-out): the gateway renders the
  prompt itself, splicing in the raw sampled ids of earlier turns so prompts
  are append-only, sends token ids to the engine, and parses reasoning, text
  and tool calls out of the sampled tokens as they stream.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from polar.ir import (
    CaptureMode,
    ChatRequest,
    DeliveryFlag,
    Delta,
    EngineEvent,
    Finish,
    FinishReason,
    JsonObject,
    MalformedToolCall,
    PromptLineage,
    PromptTokens,
    TokenLogprob,
    ToolSpec,
)
from polar.proxy.engines.base import NO_HEADERS, ChatEngine, Headers, TokenEngine, TokenRequest
from polar.proxy.render.delivery import ParsedTurn, Redelivery, call_flags, withdrawn_flags
from polar.proxy.render.parse import OutputParser, ParserOptions, Piece
from polar.proxy.render.splice import Transcript, plan_prompt
from polar.proxy.render.template import ChatTemplate
from polar.proxy.render.tokens import TokenText


@dataclass(slots=True)
class PreparedCall:
    body: JsonObject
    events: AsyncGenerator[EngineEvent, None] = field(repr=False)
    lineage: PromptLineage | None = None
    """Known up front when the gateway rendered the prompt; else measured after."""
    malformed: list[MalformedToolCall] = field(default_factory=list)
    """Tool calls the gateway's parser could not read (filled while streaming)."""
    delivery_flags: list[DeliveryFlag] = field(default_factory=list)
    """Where delivery and the sampled ids disagree (complete at the ``Finish`` event)."""


class Capture(Protocol):
    mode: CaptureMode

    @property
    def engine_name(self) -> str: ...

    @property
    def model(self) -> str: ...

    def prepare(
        self, request: ChatRequest, transcript: Transcript, *, headers: Headers = NO_HEADERS
    ) -> PreparedCall: ...

    async def count_tokens(self, request: ChatRequest) -> int:
        """Prompt tokens the request would take (no splicing, no call made)."""
        ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Reparse:
    """How engine-rendered capture reads the sampled ids itself (see
    :mod:`polar.proxy.render.delivery`)."""

    text: TokenText
    parser: ParserOptions
    stop_token_ids: tuple[int, ...]


class EngineRendered:
    """``reparse``: derive what the client receives from the sampled ids with the
    gateway's parser, flagging where the engine's own parse differs. Without it
    the engine's parse is relayed as is."""

    mode = CaptureMode.ENGINE_RENDERED

    def __init__(self, engine: ChatEngine, *, reparse: Reparse | None = None) -> None:
        self.engine = engine
        self.reparse = reparse

    @property
    def engine_name(self) -> str:
        return self.engine.name

    @property
    def model(self) -> str:
        return self.engine.model

    def prepare(
        self, request: ChatRequest, transcript: Transcript, *, headers: Headers = NO_HEADERS
    ) -> PreparedCall:
        call = self.engine.prepare(request, headers=headers)
        if self.reparse is None:
            return PreparedCall(body=call.body, events=call.events)
        redelivery = Redelivery(
            self.reparse.text,
            self.reparse.parser,
            tools=request.tools,
            stop_ids=self.reparse.stop_token_ids,
            streamed=request.stream,
        )
        return PreparedCall(
            body=call.body,
            events=redelivery.events(call.events),
            malformed=redelivery.malformed,
            delivery_flags=redelivery.flags,
        )

    async def count_tokens(self, request: ChatRequest) -> int:
        return await self.engine.count_tokens(request)

    async def aclose(self) -> None:
        await self.engine.aclose()


class GatewayRendered:
    mode = CaptureMode.TOKEN_IN_TOKEN_OUT

    def __init__(
        self,
        template: ChatTemplate,
        engine: TokenEngine,
        *,
        parser: ParserOptions,
        stop_token_ids: tuple[int, ...] = (),
    ) -> None:
        self.template = template
        self.engine = engine
        self._parser = parser
        self._stops = tuple(dict.fromkeys((template.end_of_turn_id, *stop_token_ids)))

    @property
    def engine_name(self) -> str:
        return self.engine.name

    @property
    def model(self) -> str:
        return self.engine.model

    async def count_tokens(self, request: ChatRequest) -> int:
        ids, _ = self.template.render(
            request.messages, request.tools, kwargs=request.template_kwargs
        )
        return len(ids)

    def prepare(
        self, request: ChatRequest, transcript: Transcript, *, headers: Headers = NO_HEADERS
    ) -> PreparedCall:
        plan = plan_prompt(
            self.template,
            request.messages,
            request.tools,
            transcript,
            kwargs=request.template_kwargs,
        )
        opt = self._parser
        tail = plan.tail_text
        in_reasoning = opt.reasoning and tail.rfind(opt.think_start) > tail.rfind(opt.think_end)
        parser = OutputParser(opt, tools=request.tools, in_reasoning=in_reasoning)
        call = self.engine.prepare(
            TokenRequest(
                prompt_ids=plan.ids,
                sampling=request.sampling,
                stream=request.stream,
                stop_token_ids=self._stops,
                top_logprobs=request.top_logprobs,
            ),
            headers=headers,
        )
        flags: list[DeliveryFlag] = []
        events = self._parse(
            plan.ids, call.events, parser, flags, streamed=request.stream, tools=request.tools
        )
        return PreparedCall(
            body=call.body,
            events=events,
            lineage=plan.lineage,
            malformed=parser.malformed,
            delivery_flags=flags,
        )

    async def _parse(
        self,
        prompt_ids: tuple[int, ...],
        events: AsyncGenerator[EngineEvent, None],
        parser: OutputParser,
        flags: list[DeliveryFlag],
        *,
        streamed: bool,
        tools: Sequence[ToolSpec],
    ) -> AsyncGenerator[EngineEvent, None]:
        yield PromptTokens(prompt_ids)
        turn = ParsedTurn()
        text = self.template.text
        stream = text.stream()
        calls: set[int] = set()  # tool calls made (and not withdrawn as malformed)
        async with contextlib.aclosing(events):
            async for event in events:
                if isinstance(event, Delta):
                    # Stop tokens end the turn; their text is not part of the message.
                    visible = [i for i in event.token_ids if i not in self._stops]
                    piece = parser.feed(stream.feed(visible))
                    _track(calls, piece)
                    turn.add(piece.text, piece.reasoning, piece.tool_calls)
                    flags.extend(withdrawn_flags(piece.tool_calls, streamed=streamed))
                    yield self._delta(event, piece)
                elif isinstance(event, Finish):
                    piece = parser.feed(stream.flush())
                    piece.extend(parser.finish())
                    _track(calls, piece)
                    turn.add(piece.text, piece.reasoning, piece.tool_calls)
                    flags.extend(withdrawn_flags(piece.tool_calls, streamed=streamed))
                    flags.extend(call_flags(turn, parser.written_calls, tools))
                    if piece.text or piece.reasoning or piece.tool_calls:
                        yield Delta(
                            text=piece.text,
                            reasoning=piece.reasoning,
                            tool_calls=tuple(piece.tool_calls),
                        )
                    reason = event.reason
                    if calls and reason is FinishReason.STOP:
                        reason = FinishReason.TOOL_CALLS
                    yield Finish(reason=reason, usage=event.usage, matched_stop=event.matched_stop)

    def _delta(self, event: Delta, piece: Piece) -> Delta:
        details = None
        if event.details is not None:
            text = self.template.text
            details = tuple(
                TokenLogprob(
                    token=text.decode([token_id]),
                    logprob=logprob,
                    bytes=tuple(text.bytes_of(token_id)),
                    top=(event.details[i].top if i < len(event.details) else ()),
                )
                for i, (token_id, logprob) in enumerate(
                    zip(event.token_ids, event.logprobs, strict=True)
                )
            )
        return Delta(
            token_ids=event.token_ids,
            logprobs=event.logprobs,
            text=piece.text,
            reasoning=piece.reasoning,
            tool_calls=tuple(piece.tool_calls),
            details=details,
        )

    async def aclose(self) -> None:
        await self.engine.aclose()


def _track(calls: set[int], piece: Piece) -> None:
    for delta in piece.tool_calls:
        if delta.discard:
            calls.discard(delta.index)
        else:
            calls.add(delta.index)
