"""The engine contract: what the gateway needs from an inference server.

An engine turns an IR :class:`~polar.ir.ChatRequest` into an :class:`EngineCall`:
the exact JSON body it will send (recorded verbatim) and an async iterator of
:data:`~polar.ir.EngineEvent`. Engines know nothing about dialects.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from polar.ir import ChatRequest, EngineEvent, JsonObject, Sampling

Headers = Mapping[str, str]
NO_HEADERS: Headers = MappingProxyType({})

SESSION_HEADER = "x-polar-session"
"""The header naming the session on every engine request the gateway makes
(``x-request-id`` names the record, ``session/seq.attempt``): for engine logs,
and the scripted engine's per-session scripts."""


@dataclass(frozen=True, slots=True)
class EngineCall:
    """One prepared call. ``events`` may be iterated once."""

    body: JsonObject
    events: AsyncGenerator[EngineEvent, None] = field(repr=False)


class ChatEngine(Protocol):
    """An engine that renders the chat template itself (engine-rendered capture)."""

    @property
    def name(self) -> str:
        """Short engine name stamped on records (``vllm``, ``sglang``...)."""
        ...

    @property
    def model(self) -> str:
        """The model name the engine serves; requests are rewritten to it."""
        ...

    def prepare(self, request: ChatRequest, *, headers: Headers = NO_HEADERS) -> EngineCall:
        """Build the call. Raises :class:`~polar.proxy.errors.InvalidRequest` for
        requests this engine cannot serve; talks to the network only when iterated.
        ``headers`` go on the HTTP request (the gateway tags calls with their
        session and record key)."""
        ...

    async def count_tokens(self, request: ChatRequest, *, headers: Headers = NO_HEADERS) -> int:
        """Prompt tokens the request would take, as the engine renders it. Raises
        :class:`~polar.proxy.errors.EngineError` when asking the engine fails."""
        ...

    def count_body(self, request: ChatRequest) -> JsonObject | None:
        """The body :meth:`count_tokens` sends to the engine (``None``: it sends
        none, an estimate): what the record of a count that failed holds."""
        ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class TokenRequest:
    """A generation from token ids (gateway-rendered capture)."""

    prompt_ids: tuple[int, ...]
    sampling: Sampling
    stream: bool
    stop_token_ids: tuple[int, ...] = ()
    top_logprobs: int | None = None
    """Alternatives per token the client wants to see (``None``: none)."""


class TokenEngine(Protocol):
    """An engine that takes token ids and returns sampled ids with their logprobs.

    Its events carry ``Delta.token_ids``/``Delta.logprobs`` (no text) and a
    ``Finish``; the gateway decodes and parses the text itself.
    """

    @property
    def name(self) -> str: ...

    @property
    def model(self) -> str: ...

    def prepare(self, request: TokenRequest, *, headers: Headers = NO_HEADERS) -> EngineCall: ...

    async def aclose(self) -> None: ...
