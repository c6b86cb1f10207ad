"""Capture modes: who renders the prompt and parses the output.

* :class:`EngineRendered`: the engine applies the chat template and parses
  tool calls (vLLM/SGLang chat routes); the gateway records the ids the engine
  reports and measures afterwards how each prompt relates to earlier calls.
* :class:`GatewayRendered` (token-in/token-out): the gateway renders the
  prompt itself, splicing in the raw sampled ids of earlier turns so prompts
  are append-only, sends token ids to the engine, and parses reasoning, text
  and tool calls out of the sampled tokens as they stream. Rendering and
  tokenizing run on :class:`~polar.proxy.call.offload.Offload` workers, never on
  the event loop; a conversation the chat template refuses is a 400.

:func:`build_capture` builds the one a gateway config describes.
"""

from __future__ import annotations

import contextlib
import functools
from collections import deque
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, assert_never

from jinja2 import TemplateError

from polar.configfile import ConfigError
from polar.ir import (
    Behaviour,
    CaptureMode,
    ChatRequest,
    DeliveryFlag,
    Delta,
    EngineEvent,
    Finish,
    FinishReason,
    ImagePart,
    JsonObject,
    LogprobSource,
    MalformedToolCall,
    PromptLineage,
    PromptTokens,
    ReasoningPart,
    RequestEdit,
    TextPart,
    TokenLogprob,
    ToolCall,
    ToolSpec,
)
from polar.proxy.call.behaviour import behaviour_of
from polar.proxy.call.maxtokens import ContextWindow, PromptTooLong, limited
from polar.proxy.call.offload import Offload
from polar.proxy.config import GatewayConfig
from polar.proxy.engines.base import NO_HEADERS, ChatEngine, Headers, TokenEngine, TokenRequest
from polar.proxy.engines.registry import CHAT_ENGINES, TOKEN_ENGINES, context_window, engine_factory
from polar.proxy.errors import EngineError, InvalidRequest
from polar.proxy.logtext import clip
from polar.proxy.render.delivery import ParsedTurn, Redelivery, call_flags, withdrawn_flags
from polar.proxy.render.parse import OutputParser, ParserOptions, Piece, ToolFormat
from polar.proxy.render.splice import PromptPlan, Transcript, plan_prompt
from polar.proxy.render.template import ChatTemplate
from polar.proxy.render.tokenbound import TooManyTokens
from polar.proxy.render.tokens import TokenText
from polar.proxy.render.toolprompt import ToolPrompt
from polar.tokenizer import TokenizerLoadError, load_tokenizer

T = TypeVar("T")


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
    edits: tuple[RequestEdit, ...] = ()
    """Changes made while preparing (the output limit, :mod:`polar.proxy.call.maxtokens`)."""
    prompt_ids: tuple[int, ...] = ()
    """Known up front when the gateway rendered the prompt (stored before the
    engine is called); else reported by the engine as it answers."""
    packed_prompt: bytes | None = None
    """``prompt_ids`` packed, when the gateway has them so already."""
    behaviour: Behaviour | None = None
    """The sampling settings sent and what the engine's logprobs are of."""


class PreflightFailed(Exception):
    """The engine request a capture makes before the call itself failed: in
    engine-rendered capture with a known context length, the engine's count of
    the prompt (vLLM's ``/tokenize``), which the output limit needs. ``body`` is
    what was sent; the relay records the attempt as failed with it and retries
    it as it retries the call (:mod:`polar.proxy.call.relay`)."""

    def __init__(self, error: EngineError, body: JsonObject) -> None:
        super().__init__(error.message)
        self.error = error
        self.body = body


class Capture(Protocol):
    mode: CaptureMode
    context: ContextWindow
    """The model's context length (asked of the engine when the gateway starts)."""

    @property
    def engine_name(self) -> str: ...

    @property
    def model(self) -> str: ...

    async def prepare(
        self, request: ChatRequest, transcript: Transcript, *, headers: Headers = NO_HEADERS
    ) -> PreparedCall:
        """Build the engine call, with the output limit of :mod:`polar.proxy.call.maxtokens`
        (nothing is sent until its events are iterated, except the engine's count
        of the prompt where the limit needs one). Raises
        :class:`~polar.proxy.errors.InvalidRequest` for a request that cannot be
        rendered or whose prompt fills the context, :class:`PreflightFailed` when
        the engine's count fails."""
        ...

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

    def __init__(
        self,
        engine: ChatEngine,
        *,
        reparse: Reparse | None = None,
        context: ContextWindow | None = None,
        logprobs: LogprobSource = LogprobSource.RAW,
    ) -> None:
        self.engine = engine
        self.reparse = reparse
        self.context = context or ContextWindow()
        self.logprobs = logprobs

    @property
    def engine_name(self) -> str:
        return self.engine.name

    @property
    def model(self) -> str:
        return self.engine.model

    async def prepare(
        self, request: ChatRequest, transcript: Transcript, *, headers: Headers = NO_HEADERS
    ) -> PreparedCall:
        _need_messages(request)  # as in token mode: the engine is not asked to render nothing
        context = self.context.length
        prompt = 0
        if context is not None:
            # The engine renders the prompt: only it can say how long it is.
            try:
                prompt = await self.engine.count_tokens(request, headers=headers)
            except EngineError as exc:
                raise PreflightFailed(exc, self.engine.count_body(request) or {}) from None
        request, edits = limited(
            request, prompt_tokens=prompt, context=context, default=self.context.default_max_tokens
        )
        call = self.engine.prepare(request, headers=headers)
        behaviour = behaviour_of(request, self.logprobs, guided=True)
        if self.reparse is None:
            return PreparedCall(
                body=call.body, events=call.events, edits=edits, behaviour=behaviour
            )
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
            edits=edits,
            behaviour=behaviour,
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
        context: ContextWindow | None = None,
        offload: Offload | None = None,
        logprobs: LogprobSource = LogprobSource.RAW,
    ) -> None:
        self.template = template
        self.engine = engine
        self.logprobs = logprobs
        self.context = context or ContextWindow()
        self._parser = parser
        self._offload = offload or Offload(workers=2, budget_bytes=64 << 20)
        self._stops = tuple(dict.fromkeys((template.end_of_turn_id, *stop_token_ids)))

    @property
    def engine_name(self) -> str:
        return self.engine.name

    @property
    def model(self) -> str:
        return self.engine.model

    async def count_tokens(self, request: ChatRequest) -> int:
        _need_messages(request)
        ids, _ = await self._offload.run(
            request_size(request), self._rendered, self.template.render, request
        )
        return len(ids)

    def _rendered(self, step: Callable[..., T], request: ChatRequest, *args: object) -> T:
        """Run a template step (on a worker), a refusal of the template becoming a 400."""
        try:
            return step(request.messages, request.tools, *args, kwargs=request.template_kwargs)
        except TemplateError as exc:
            raise InvalidRequest(
                f"the chat template cannot render this conversation: {clip(str(exc))}"
            ) from None

    async def prepare(
        self, request: ChatRequest, transcript: Transcript, *, headers: Headers = NO_HEADERS
    ) -> PreparedCall:
        _need_messages(request)
        # The worker reads a snapshot: the loop may add to the transcript meanwhile.
        snapshot = Transcript(calls=deque(transcript.calls, maxlen=transcript.calls.maxlen))
        context = self.context.length
        # A prompt that cannot leave a token to sample is refused as soon as that is
        # known: a multi-megabyte one is never tokenized whole (render.tokenbound).
        most = None if context is None else context - 1
        try:
            plan: PromptPlan = await self._offload.run(
                request_size(request),
                self._rendered,
                functools.partial(plan_prompt, self.template, most=most),
                request,
                snapshot,
            )
        except TooManyTokens as exc:
            raise PromptTooLong(
                f"This model's maximum context length is {context} tokens, and the prompt "
                f"alone takes at least {exc.at_least}: no room is left to generate. "
                "Shorten the conversation.",
                param="messages",
            ) from None
        opt = self._parser
        tail = plan.tail_text
        in_reasoning = opt.reasoning and tail.rfind(opt.think_start) > tail.rfind(opt.think_end)
        parser = OutputParser(opt, tools=request.tools, in_reasoning=in_reasoning)
        request, edits = limited(
            request,
            prompt_tokens=len(plan.ids),
            context=context,
            default=self.context.default_max_tokens,
        )
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
            plan.ids,
            call.events,
            parser,
            flags,
            streamed=request.stream,
            tools=request.tools,
            details=request.top_logprobs is not None,
        )
        return PreparedCall(
            body=call.body,
            events=events,
            lineage=plan.lineage,
            malformed=parser.malformed,
            delivery_flags=flags,
            edits=edits,
            prompt_ids=plan.ids,
            packed_prompt=plan.packed,
            # Token routes take no constraints: nothing masks the distribution.
            behaviour=behaviour_of(request, self.logprobs, guided=False),
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
        details: bool,
    ) -> AsyncGenerator[EngineEvent, None]:
        """``details``: the client asked for logprobs, so each delta carries per-token
        detail, built here from the ids (the engine adds alternatives when asked)."""
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
                    yield self._delta(event, piece, details)
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

    def _delta(self, event: Delta, piece: Piece, wanted: bool) -> Delta:
        details = None
        if wanted and event.token_ids:
            # The token's text and bytes are the tokenizer's, whatever the engine
            # says; the engine only has the alternatives (when they were asked for).
            piece_of = self.template.text.piece
            n = len(event.token_ids)
            tops = [d.top for d in (event.details or ())[:n]]
            tops += [()] * (n - len(tops))
            details = tuple(
                TokenLogprob(token, logprob, tuple(data), top)  # positional: per token
                for (token, data), logprob, top in zip(
                    map(piece_of, event.token_ids), event.logprobs, tops, strict=True
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


def _need_messages(request: ChatRequest) -> None:
    if not request.messages:
        raise InvalidRequest("the request has no messages: there is no conversation to continue")


def request_size(request: ChatRequest) -> int:
    """About how many bytes of text a request carries (what rendering it costs)."""
    size = 0
    for message in request.messages:
        for part in message.parts:
            match part:
                case TextPart(text=text) | ReasoningPart(text=text):
                    size += len(text)
                case ToolCall(arguments=arguments):
                    size += len(arguments)
                case ImagePart(url=url):
                    size += len(url)
                case _:
                    assert_never(part)
    return size + sum(len(str(tool.parameters)) for tool in request.tools)


def build_capture(
    config: GatewayConfig, *, template: ChatTemplate | None = None, offload: Offload | None = None
) -> Capture:
    """The capture ``config`` describes. ``template``: the chat template
    ``config.render`` names, already loaded (gateways in one process can share
    one; loading a tokenizer takes a good part of a second). ``offload``: the
    workers that render prompts (token-in/token-out), the gateway's own."""
    kind = config.engine.kind
    context = context_window(config.engine)
    if config.capture is CaptureMode.ENGINE_RENDERED:
        if kind == "embedded":
            raise ConfigError(
                "engine.kind: the embedded engine takes token ids; use capture: token_in_token_out"
            )
        chat = engine_factory(kind, CHAT_ENGINES)(config)
        logprobs = config.engine.logprob_source
        if config.render.engine_output == "engine_parser":
            return EngineRendered(chat, context=context, logprobs=logprobs)
        template = template or _template(config)
        return EngineRendered(
            chat,
            context=context,
            logprobs=logprobs,
            reparse=Reparse(
                text=template.text,
                parser=_parser_options(config),
                stop_token_ids=(template.end_of_turn_id, *config.render.stop_token_ids),
            ),
        )
    tokens = engine_factory(kind, TOKEN_ENGINES)(config)
    return GatewayRendered(
        template or _template(config),
        tokens,
        parser=_parser_options(config),
        stop_token_ids=tuple(config.render.stop_token_ids),
        context=context,
        offload=offload,
        logprobs=config.engine.logprob_source,
    )


def check_tokenizer(config: GatewayConfig) -> None:
    """That ``render.tokenizer`` loads, as building the capture loads it
    (``--check``; the default, the bundled Qwen3 one, always does)."""
    if config.render.tokenizer is None:
        return
    try:
        load_tokenizer(config.render.tokenizer)
    except TokenizerLoadError as exc:
        raise ConfigError(f"render.tokenizer: {exc}") from None


def _template(config: GatewayConfig) -> ChatTemplate:
    render = config.render
    try:
        tokenizer = load_tokenizer(render.tokenizer)
    except TokenizerLoadError as exc:
        raise ConfigError(f"render.tokenizer: {exc}") from None
    try:
        template = ChatTemplate(
            tokenizer,
            template_kwargs=render.template_kwargs,
            end_of_turn=render.end_of_turn,
            segment_cache_bytes=render.segment_cache_bytes,
            tool_prompt=ToolPrompt(render.tool_prompt),
        )
    except ValueError as exc:
        raise ConfigError(f"render.end_of_turn: {exc}") from None
    hermes = template.tool_prompt is ToolPrompt.HERMES
    if (
        hermes
        and config.capture is CaptureMode.TOKEN_IN_TOKEN_OUT
        and render.tool_format != "hermes"
    ):
        raise ConfigError(
            f"render.tool_prompt: the chat template of {render.tokenizer} has no tool section, "
            "so the gateway writes tools in the hermes format: set tool_format: hermes"
        )
    return template


def _parser_options(config: GatewayConfig) -> ParserOptions:
    render = config.render
    return ParserOptions(tool_format=ToolFormat(render.tool_format), reasoning=render.reasoning)
