"""What the HTTP engine adapters share.

:class:`HttpEngine` holds the transport to the engine and the model it serves,
for every adapter (vLLM's and SGLang's, chat and token routes).
:class:`CompatChatEngine` adds the OpenAI-compatible chat body that both
engines' chat routes take (:func:`~polar.proxy.engines.openai_compat.chat_body`),
with the adapter's own name for the reasoning field, and the call that is not
streamed; each engine's module adds its capture flags and reads its replies.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from typing import Any, ClassVar

from polar.ir import ChatRequest, EngineEvent
from polar.proxy.engines.base import Headers
from polar.proxy.engines.openai_compat import chat_body
from polar.proxy.engines.replies import guarded
from polar.proxy.engines.transport import Transport

CHAT_PATH = "/v1/chat/completions"
"""The OpenAI-compatible chat route, the same on vLLM and SGLang."""


class HttpEngine:
    """An engine reached over HTTP through ``transport``, serving ``model``."""

    def __init__(self, transport: Transport, *, model: str) -> None:
        self._transport = transport
        self._model = model

    @property
    def model(self) -> str:
        return self._model

    async def aclose(self) -> None:
        await self._transport.aclose()


class CompatChatEngine(HttpEngine):
    """An engine-rendered chat adapter over an OpenAI-compatible chat route."""

    reasoning_field: ClassVar[str]
    """Where an assistant message's reasoning goes in the body (``reasoning``
    for vLLM, ``reasoning_content`` for SGLang)."""

    def __init__(
        self,
        transport: Transport,
        *,
        model: str,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(transport, model=model)
        self._template_kwargs = dict(template_kwargs or {})

    def chat_body(self, request: ChatRequest) -> dict[str, Any]:
        """The request as the chat route's body, without capture flags."""
        return chat_body(
            request,
            model=self._model,
            reasoning_field=self.reasoning_field,
            template_kwargs=self._template_kwargs,
        )

    def reply_events(self, reply: Any, *, details: bool) -> list[EngineEvent]:
        """A whole (not streamed) reply of the chat route as IR events; ``details``:
        whether the client asked for per-token logprob detail."""
        raise NotImplementedError

    @guarded
    async def _once(
        self, body: dict[str, Any], details: bool, headers: Headers
    ) -> AsyncGenerator[EngineEvent, None]:
        reply = await self._transport.post_json(CHAT_PATH, body, headers)
        for event in self.reply_events(reply, details=details):
            yield event
