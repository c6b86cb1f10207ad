"""How many tokens a call may sample: the gateway's max-tokens policy.

Agent CLIs disagree about output limits. Codex and mini-swe-agent send none,
and vLLM's completions route (like the embedded engine) then stops after 16
tokens; Claude Code and opencode ask for 32,000 to 128,000, more than a small
model's context leaves after their prompt, and the engine refuses the call.
So the gateway decides the limit itself, the same way in both capture modes
and every dialect, once it knows the prompt's length:

* no limit asked: the rest of the context, or the configured default when
  that is smaller;
* more than the rest of the context: the rest of the context;
* otherwise the client's own limit, untouched.

A limit the gateway set or changed is recorded on the call as a
:class:`~polar.ir.RequestEdit`. A prompt that leaves no room to sample is the
client's error (400), as the engine would answer.

The context length comes from the configuration when it names one, else from
the engine (``GET /v1/models``: vLLM and the embedded engine report
``max_model_len``), asked once. Everything here but :class:`ContextWindow` is
a pure function.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from polar.ir import ChatRequest, EditKind, RequestEdit
from polar.proxy.errors import EngineError, InvalidRequest

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class OutputLimit:
    """The limit decided for one call. ``applied`` is ``None`` only when nothing
    was asked and neither a context length nor a default is known (the engine's
    own default then applies)."""

    requested: int | None
    applied: int | None
    edit: EditKind | None = None
    """How the gateway changed the request (``None``: it did not)."""


class PromptTooLong(InvalidRequest):
    """The prompt fills the model's whole context."""


def output_limit(
    requested: int | None, *, prompt_tokens: int, context: int | None, default: int | None = None
) -> OutputLimit:
    """Decide a call's output limit (see the module docstring).

    Raises :class:`PromptTooLong` when the prompt leaves no token to sample.
    """
    if context is None:
        if requested is None and default is not None:
            return OutputLimit(None, default, EditKind.DEFAULTED_MAX_TOKENS)
        return OutputLimit(requested, requested)
    room = context - prompt_tokens
    if room < 1:
        raise PromptTooLong(
            f"This model's maximum context length is {context} tokens, and the prompt alone "
            f"takes {prompt_tokens}: no room is left to generate. Shorten the conversation.",
            param="messages",
        )
    if requested is None:
        return OutputLimit(
            None, room if default is None else min(default, room), EditKind.DEFAULTED_MAX_TOKENS
        )
    if requested > room:
        return OutputLimit(requested, room, EditKind.CLAMPED_MAX_TOKENS)
    return OutputLimit(requested, requested)


def describe(limit: OutputLimit, *, prompt_tokens: int, context: int | None) -> str:
    """The edit's detail: what was asked, what applies, and why."""
    asked = "no limit" if limit.requested is None else f"max_tokens {limit.requested}"
    if context is None:
        return f"{asked} asked; max_tokens {limit.applied} applied (the configured default)"
    return (
        f"{asked} asked; max_tokens {limit.applied} applied "
        f"(context {context} - prompt {prompt_tokens} = {context - prompt_tokens} left)"
    )


def limited(
    request: ChatRequest, *, prompt_tokens: int, context: int | None, default: int | None = None
) -> tuple[ChatRequest, tuple[RequestEdit, ...]]:
    """The request with the policy's limit, and the edit to record (if any)."""
    limit = output_limit(
        request.sampling.max_tokens, prompt_tokens=prompt_tokens, context=context, default=default
    )
    if limit.edit is None:
        return request, ()
    sampling = dataclasses.replace(request.sampling, max_tokens=limit.applied)
    edit = RequestEdit(
        kind=limit.edit, detail=describe(limit, prompt_tokens=prompt_tokens, context=context)
    )
    return dataclasses.replace(request, sampling=sampling), (edit,)


def context_from_models(reply: Any, model: str) -> int | None:
    """``max_model_len`` of ``model`` in a ``GET /v1/models`` reply (vLLM's shape),
    or of the only model listed; ``None`` when the reply does not say."""
    data = reply.get("data") if isinstance(reply, dict) else None
    if not isinstance(data, list):
        return None
    entries = [entry for entry in data if isinstance(entry, dict)]
    named = [entry for entry in entries if entry.get("id") == model]
    chosen = named or (entries if len(entries) == 1 else [])
    if not chosen:
        return None
    value = chosen[0].get("max_model_len")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value


class ContextWindow:
    """The model's context length: configured, or asked of the engine once.

    A failed question (engine not up yet, a reply without ``max_model_len``)
    is asked again on a later call; meanwhile the length counts as unknown.
    """

    def __init__(
        self,
        configured: int | None = None,
        fetch: Callable[[], Awaitable[int | None]] | None = None,
        *,
        default_max_tokens: int | None = None,
    ) -> None:
        self._length = configured
        self._fetch = fetch
        self._settled = configured is not None or fetch is None
        self._lock = asyncio.Lock()
        self.default_max_tokens = default_max_tokens

    async def length(self) -> int | None:
        if self._settled or self._fetch is None:
            return self._length
        async with self._lock:
            if not self._settled:
                try:
                    self._length = await self._fetch()
                except (EngineError, OSError) as exc:  # asked again next call
                    _log.warning("cannot learn the model's context length: %s", exc)
                else:
                    self._settled = True
                    if self._length is None:
                        _log.warning(
                            "the engine does not report its context length (max_model_len); "
                            "set engine.max_model_len so calls without max_tokens get a limit"
                        )
        return self._length
