"""The scripted engine as a real HTTP server (vLLM's routes and wire format, or SGLang's).

The HTTP surface only: each route reads its request, asks the
:class:`~polar.testing.scripted.player.ScriptPlayer` for the turn that answers
it, samples the turn (:func:`~polar.testing.scripted.vllm_wire.generate`) and
writes the reply with :mod:`~polar.testing.scripted.vllm_replies` or
:mod:`~polar.testing.scripted.sglang_wire`.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Literal

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from polar.proxy.engines import vllm_protocol
from polar.proxy.engines.adapter import CHAT_PATH
from polar.proxy.engines.base import SESSION_HEADER
from polar.serverthread import ServerThread
from polar.testing.scripted import sglang_wire, vllm_replies, vllm_wire
from polar.testing.scripted.pacing import Pacing
from polar.testing.scripted.player import ScriptMismatch, ScriptPlayer
from polar.testing.scripted.script import ObservedRequest, Script, SessionScripts, Turn
from polar.tokenizer import Tokenizer

_SSE = "text/event-stream"


def _json(body: Any, status: int = 200) -> Response:
    return Response(vllm_protocol.encode(body), status_code=status, media_type="application/json")


def _error(message: str, status: int, kind: str) -> Response:
    return _json(vllm_protocol.error_body(message, status, kind=kind), status)


def _mismatch(exc: ScriptMismatch) -> Response:
    return _error(f"scripted engine: {exc}", 500, "ScriptMismatch")


async def _read_json(request: Request) -> Any:
    """The request's JSON body; raises ``orjson.JSONDecodeError``."""
    return orjson.loads(await request.body())


class ScriptedEngine:
    """A vLLM look-alike that replays ``script`` (one script for every request,
    or :class:`SessionScripts`: one per session, keyed by :data:`SESSION_HEADER`).

    Use it as a context manager (it starts a server on a free port) or mount
    :attr:`app` yourself. ``token_delay_s`` paces streamed tokens, for tests
    of streaming and disconnects.
    """

    def __init__(
        self,
        script: Script | SessionScripts,
        tokenizer: Tokenizer,
        *,
        model: str = "scripted",
        token_delay_s: float = 0.0,
        max_model_len: int = 32768,
        wire: Literal["vllm", "sglang"] = "vllm",
    ) -> None:
        self.script = script
        self.wire = wire
        self.tokenizer = tokenizer
        self.model = model
        self.token_delay_s = token_delay_s
        self.max_model_len = max_model_len
        self._player = ScriptPlayer(script)
        self._weights = _SglangWeights(model)
        self._server: ServerThread | None = None
        self.app = Starlette(routes=self._routes())

    def _routes(self) -> list[Route]:
        routes = [
            Route(CHAT_PATH, self._chat, methods=["POST"]),
            Route(vllm_protocol.COMPLETIONS_PATH, self._completions, methods=["POST"]),
            Route("/generate", self._generate, methods=["POST"]),
            Route(vllm_protocol.TOKENIZE_PATH, self._tokenize, methods=["POST"]),
            Route(vllm_protocol.MODELS_PATH, self._models, methods=["GET"]),
            Route(vllm_protocol.HEALTH_PATH, self._health, methods=["GET"]),
        ]
        if self.wire == "sglang":
            routes += [
                Route("/update_weights_from_disk", self._weights.update, methods=["POST"]),
                Route("/model_info", self._weights.info, methods=["GET"]),
                Route("/get_model_info", self._weights.info, methods=["GET"]),
            ]
        return routes

    # ---------------------------------------------------------------- control

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("scripted engine is not running")
        return self._server.url

    def start(self) -> ScriptedEngine:
        self._server = ServerThread(self.app).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def __enter__(self) -> ScriptedEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def failures(self) -> list[str]:
        return self._player.failures

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Every request body received, in order."""
        return self._player.requests

    @property
    def sessions(self) -> list[str | None]:
        """The session of every request received (its :data:`SESSION_HEADER`), in order."""
        return self._player.sessions

    @property
    def weight_updates(self) -> list[dict[str, Any]]:
        """Weight updates accepted (SGLang wire), in order."""
        return self._weights.updates

    @property
    def weight_version(self) -> str:
        return self._weights.version

    @property
    def assignments(self) -> dict[str, int]:
        """Per-session scripts: which script each session got (session -> index)."""
        return self._player.assignments

    @property
    def remaining(self) -> int:
        """Scripted turns not used yet (cycling scripts count none)."""
        return self._player.remaining

    def assert_clean(self, *, finished: bool = True) -> None:
        """Raise if any request mismatched, or (``finished``) turns were left unused."""
        failures = self.failures
        if failures:
            raise AssertionError("scripted engine saw mismatches:\n" + "\n".join(failures))
        if finished and self.remaining:
            raise AssertionError(f"scripted engine has {self.remaining} unused turns")

    # ---------------------------------------------------------------- turns

    def _fail(self, message: str) -> Response:
        self._player.fail(message)
        return _error(f"scripted engine: {message}", 500, "ScriptMismatch")

    def _sample(self, turn: Turn, max_tokens: int | None) -> vllm_wire.Generation:
        """The turn's tokens, cut at ``max_tokens`` (or the turn's own limit);
        raises ``ValueError`` if the turn cannot be produced under it."""
        if turn.max_tokens is not None:
            max_tokens = min(max_tokens or turn.max_tokens, turn.max_tokens)
        return vllm_wire.generate(
            self.tokenizer,
            turn.output_text(),
            max_tokens=max_tokens,
            force_length=turn.finish == "length",
        )

    def _token_turn(
        self,
        body: dict[str, Any],
        prompt: list[int],
        max_tokens: int | None,
        session: str | None,
    ) -> tuple[Turn, vllm_wire.Generation]:
        """Check a token-in request against the script; sample the scripted turn."""
        if not prompt or not all(isinstance(i, int) for i in prompt):
            raise ScriptMismatch("the prompt must be a non-empty list of token ids")
        seen = ObservedRequest(
            prompt_ids=tuple(prompt),
            prompt_text=self.tokenizer.decode(prompt, skip_special_tokens=False),
        )
        turn = self._player.next_turn(body, seen, session)
        try:
            return turn, self._sample(turn, max_tokens)
        except ValueError as exc:
            raise ScriptMismatch(str(exc)) from None

    def _pacing(self, turn: Turn) -> Pacing:
        return Pacing(self.token_delay_s, turn.crash_after)

    # ---------------------------------------------------------------- routes

    async def _health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def _models(self, request: Request) -> Response:
        return _json(
            vllm_protocol.model_list(
                self.model,
                max_model_len=self.max_model_len,
                owned_by="vllm",
                created=int(time.time()),
                full=True,
            )
        )

    async def _tokenize(self, request: Request) -> Response:
        body = await _read_json(request)
        if "messages" in body:
            ids = vllm_wire.render_prompt(self.tokenizer, body)
        else:
            ids = list(self.tokenizer.encode(body["prompt"], add_special_tokens=False))
        return _json(vllm_protocol.tokenize_reply(ids, max_model_len=self.max_model_len))

    async def _chat(self, request: Request) -> Response:
        try:
            body = await _read_json(request)
        except orjson.JSONDecodeError as exc:
            return _error(f"invalid JSON: {exc}", 400, "Bad Request")
        refusal = self._chat_refusal(body)
        if refusal is not None:
            return refusal
        tools = body.get("tools") or []
        seen = ObservedRequest(
            messages=body.get("messages") or [],
            tool_names=tuple((t.get("function") or {}).get("name", "") for t in tools),
        )
        try:
            turn = self._player.next_turn(body, seen, request.headers.get(SESSION_HEADER))
        except ScriptMismatch as exc:
            return _mismatch(exc)
        if body.get("stop"):
            return self._fail(
                "the request has stop strings, which the scripted engine does not emulate"
            )
        try:
            prompt = vllm_wire.render_prompt(self.tokenizer, body)
            max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
            gen = self._sample(turn, max_tokens)
        except ValueError as exc:
            return self._fail(str(exc))
        return self._chat_reply(body, prompt, gen, turn, bool(tools))

    def _chat_refusal(self, body: dict[str, Any]) -> Response | None:
        """The error a chat request gets before the script is consulted (``None``: none)."""
        if self.wire == "sglang":
            flag_error = sglang_wire.stream_flag_error(body)
            if flag_error is not None:
                return _json(sglang_wire.error_body(flag_error, "BadRequest", 400), 400)
            if body.get("stream"):
                return self._fail("streaming SGLang chat without capture flags is not emulated")
        elif body.get("model") != self.model:
            return _error(
                f"The model `{body.get('model')}` does not exist. Valid aliases: {self.model}.",
                404,
                "NotFoundError",
            )
        return None

    def _chat_reply(
        self,
        body: dict[str, Any],
        prompt: list[int],
        gen: vllm_wire.Generation,
        turn: Turn,
        has_tools: bool,
    ) -> Response:
        tools_offered = has_tools and body.get("tool_choice") != "none"
        if self.wire == "sglang":
            reply = sglang_wire.whole_response(
                self.tokenizer,
                body,
                prompt,
                gen,
                tools_offered=tools_offered,
                model=self.model,
                weight_version=self.weight_version,
            )
            return _json(reply)
        answer = vllm_replies.Answer(self.tokenizer, body, prompt, gen, self.model)
        if body.get("stream"):
            events = vllm_replies.chat_events(
                answer, tools_offered=tools_offered, pacing=self._pacing(turn)
            )
            return StreamingResponse(events, media_type=_SSE)
        return _json(vllm_replies.chat_whole(answer, tools_offered=tools_offered))

    async def _completions(self, request: Request) -> Response:
        try:
            body = await _read_json(request)
        except orjson.JSONDecodeError as exc:
            return _error(f"invalid JSON: {exc}", 400, "Bad Request")
        if body.get("model") != self.model:
            return _error(f"The model `{body.get('model')}` does not exist.", 404, "NotFoundError")
        prompt = body.get("prompt")
        if not isinstance(prompt, list):
            return self._fail("the scripted engine takes token-id prompts on /v1/completions")
        try:
            turn, gen = self._token_turn(
                body, prompt, body.get("max_tokens"), request.headers.get(SESSION_HEADER)
            )
        except ScriptMismatch as exc:
            return _mismatch(exc)
        answer = vllm_replies.Answer(self.tokenizer, body, prompt, gen, self.model)
        if not body.get("stream"):
            return _json(vllm_replies.completion_whole(answer))
        events = vllm_replies.completion_events(answer, self._pacing(turn))
        return StreamingResponse(events, media_type=_SSE)

    async def _generate(self, request: Request) -> Response:
        try:
            body = await _read_json(request)
        except orjson.JSONDecodeError as exc:
            return _json({"error": {"message": f"invalid JSON: {exc}"}}, 400)
        prompt = body.get("input_ids")
        if not isinstance(prompt, list):
            return self._fail("the scripted engine takes input_ids on /generate")
        params = body.get("sampling_params") or {}
        try:
            turn, gen = self._token_turn(
                body,
                prompt,
                params.get("max_new_tokens", 128),
                request.headers.get(SESSION_HEADER),
            )
        except ScriptMismatch as exc:
            return _json({"error": {"message": f"scripted engine: {exc}"}}, 400)
        args = (self.tokenizer, gen, prompt, body)
        if not body.get("stream"):
            return _json(sglang_wire.generate_whole(*args, weight_version=self.weight_version))
        events = sglang_wire.generate_events(
            *args, weight_version=self.weight_version, pacing=self._pacing(turn)
        )
        return StreamingResponse(events, media_type=_SSE)


class _SglangWeights:
    """The SGLang wire's weight routes: the scripted model has no weights to swap,
    so an update is checked as SGLang's loader would and recorded."""

    def __init__(self, model_path: str) -> None:
        self._lock = threading.Lock()
        self._version = "default"
        self._model_path = model_path
        self._updates: list[dict[str, Any]] = []

    @property
    def version(self) -> str:
        with self._lock:
            return self._version

    @property
    def updates(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._updates)

    async def update(self, request: Request) -> Response:
        try:
            body = await _read_json(request)
        except orjson.JSONDecodeError:
            return _json({"detail": "There was an error parsing the body"}, 400)
        with self._lock:
            status, reply, version = sglang_wire.weights_update(body, self._version)
            if status == 200:
                self._version = version
                self._model_path = str(body["model_path"])
                self._updates.append(dict(body))
        return _json(reply, status)

    async def info(self, request: Request) -> Response:
        with self._lock:
            return _json(sglang_wire.model_info(self._model_path, self._version))
