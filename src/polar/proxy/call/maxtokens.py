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
the engine (``GET /v1/models``: vLLM, SGLang and the embedded engine report
``max_model_len``), asked when the gateway starts, never on a call's path (see
:class:`ContextWindow`). Everything here but :class:`ContextWindow` is a pure
function.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from polar.ir import ChatRequest, EditKind, RequestEdit
from polar.proxy.errors import (
    EngineError,
    EngineHTTPError,
    EngineTimeout,
    EngineUnavailable,
    InvalidRequest,
)

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


class ContextSource(StrEnum):
    """Where the context length a gateway works with comes from."""

    CONFIGURED = "configured"
    """``engine.max_model_len``."""
    ENGINE = "engine"
    """The engine's ``GET /v1/models``."""
    ASKING = "asking"
    """Not known yet: the engine did not answer, and is asked again in the background."""
    UNKNOWN = "unknown"
    """The engine answered without one (no ``max_model_len``, no such route)."""


UNKNOWN_WARNING = (
    "no context length known: a call that asks for no output limit gets the engine's own "
    "default (vLLM's completions route and the embedded engine: 16 tokens); set "
    "engine.max_model_len (or engine.default_max_tokens)"
)


class ContextWindow:
    """The model's context length: configured, or asked of the engine.

    Contract: calls read the length known when they arrive (:attr:`length`);
    they never wait for the engine's answer and never wait on each other. The
    engine is asked when the gateway starts (:meth:`start`, one try bounded by
    ``ask_timeout_s``). A try that does not get an answer (engine not up yet, a
    5xx, a stall, a reset) is repeated in the background, ``retry_s`` apart and
    doubling up to ``max_retry_s``, until one does; meanwhile the length is
    unknown (:attr:`source` ``asking``). An answer without a length (no
    ``max_model_len``, a 4xx, a reply the gateway cannot read) settles it as
    unknown. Unknown is warned about at start and in ``/health`` (:meth:`health`).
    """

    def __init__(
        self,
        configured: int | None = None,
        fetch: Callable[[], Awaitable[int | None]] | None = None,
        *,
        default_max_tokens: int | None = None,
        ask_timeout_s: float = 10.0,
        retry_s: float = 1.0,
        max_retry_s: float = 30.0,
    ) -> None:
        self._length = configured
        self._fetch = fetch if configured is None else None
        self.source = (
            ContextSource.CONFIGURED
            if configured is not None
            else ContextSource.ASKING
            if fetch is not None
            else ContextSource.UNKNOWN
        )
        self.default_max_tokens = default_max_tokens
        self._ask_timeout_s = ask_timeout_s
        self._retry_s = retry_s
        self._max_retry_s = max_retry_s
        self._asking: asyncio.Task[None] | None = None
        self.asked = 0
        """Questions asked of the engine so far."""

    @property
    def length(self) -> int | None:
        """The context length known now (``None``: unknown)."""
        return self._length

    async def start(self) -> None:
        """Ask the engine once (bounded by ``ask_timeout_s``); without an answer, go on
        asking in the background. Warns when the length is not known after the try."""
        if self._fetch is None or self._asking is not None:
            self._warn_unknown()
            return
        if not await self._try():
            _log.warning(
                "cannot learn the model's context length yet; asking the engine again in "
                "the background. Until it answers, %s",
                UNKNOWN_WARNING,
            )
            self._asking = asyncio.ensure_future(self._keep_asking())
            return
        self._warn_unknown()

    async def aclose(self) -> None:
        """Stop asking (the gateway stops)."""
        if self._asking is not None:
            self._asking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._asking

    def health(self) -> dict[str, Any]:
        """What ``/health`` shows: the length, its source, and the warning when unknown."""
        known = self._length is not None
        return {
            "max_model_len": self._length,
            "source": self.source.value,
            **({} if known else {"warning": UNKNOWN_WARNING}),
        }

    async def _keep_asking(self) -> None:
        wait = self._retry_s
        while not await self._try():
            await asyncio.sleep(wait)
            wait = min(wait * 2, self._max_retry_s)
        if self._length is not None:
            _log.info("the model's context length is %d tokens (the engine's)", self._length)
        else:
            self._warn_unknown()

    async def _try(self) -> bool:
        """One question to the engine; whether it was answered (the source is settled)."""
        assert self._fetch is not None
        self.asked += 1
        try:
            async with asyncio.timeout(self._ask_timeout_s):
                length = await self._fetch()
        except TimeoutError:
            _log.debug("GET /v1/models: no answer within %.0f s", self._ask_timeout_s)
            return False
        except EngineError as exc:
            transient = isinstance(exc, EngineUnavailable | EngineTimeout) or (
                isinstance(exc, EngineHTTPError) and exc.upstream_status >= 500
            )
            if transient:
                _log.debug("GET /v1/models failed: %s", exc.message[:300])
                return False
            _log.warning("GET /v1/models: %s", exc.message[:300])
            length = None
        except OSError as exc:
            _log.debug("GET /v1/models failed: %s", exc)
            return False
        self._length = length
        self.source = ContextSource.UNKNOWN if length is None else ContextSource.ENGINE
        return True

    def _warn_unknown(self) -> None:
        if self._length is None and self.source is not ContextSource.ASKING:
            _log.warning("%s", UNKNOWN_WARNING)
