"""The scripted engine as a real HTTP server (vLLM's routes and wire format)."""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from polar.proxy.engines.base import SESSION_HEADER
from polar.serverthread import ServerThread
from polar.testing.scripted import sglang_wire, vllm_wire
from polar.testing.scripted.script import ObservedRequest, Script, SessionScripts, Turn


@dataclass(slots=True)
class _State:
    requests: list[dict[str, Any]] = field(default_factory=list)
    sessions: list[str | None] = field(default_factory=list)
    """The session header of each request in ``requests`` (``None``: none sent)."""
    failures: list[str] = field(default_factory=list)
    positions: dict[str | None, int] = field(default_factory=dict)
    """Turns used, per session (``None``: the one script of a single-script engine)."""
    assigned: dict[str, int] = field(default_factory=dict)
    """Per-session scripts: session -> index of the script it follows."""
    taken: int = 0
    """Per-session scripts without a ``session`` pattern handed out so far."""
    weight_version: str = "default"
    model_path: str = ""
    weight_updates: list[dict[str, Any]] = field(default_factory=list)
    """Accepted ``/update_weights_from_disk`` bodies (SGLang wire)."""


class ScriptMismatch(Exception):
    pass


class ScriptedCrash(Exception):
    """Raised inside a streaming reply: the server drops the connection mid-stream."""


def _json(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def _error(message: str, status: int, kind: str) -> Response:
    return _json(
        {"error": {"message": message, "type": kind, "param": None, "code": status}}, status
    )


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
        tokenizer: Any,
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
        self._state = _State(model_path=model)
        self._lock = threading.Lock()
        self._server: ServerThread | None = None
        routes = [
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/completions", self._completions, methods=["POST"]),
            Route("/generate", self._generate, methods=["POST"]),
            Route("/tokenize", self._tokenize, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/health", self._health, methods=["GET"]),
        ]
        if wire == "sglang":
            routes += [
                Route("/update_weights_from_disk", self._update_weights, methods=["POST"]),
                Route("/model_info", self._model_info, methods=["GET"]),
                Route("/get_model_info", self._model_info, methods=["GET"]),
            ]
        self.app = Starlette(routes=routes)

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
        with self._lock:
            return list(self._state.failures)

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Every request body received, in order."""
        with self._lock:
            return list(self._state.requests)

    @property
    def sessions(self) -> list[str | None]:
        """The session of every request received (its :data:`SESSION_HEADER`), in order."""
        with self._lock:
            return list(self._state.sessions)

    @property
    def weight_updates(self) -> list[dict[str, Any]]:
        """Weight updates accepted (SGLang wire), in order."""
        with self._lock:
            return list(self._state.weight_updates)

    @property
    def weight_version(self) -> str:
        with self._lock:
            return self._state.weight_version

    @property
    def assignments(self) -> dict[str, int]:
        """Per-session scripts: which script each session got (session -> index)."""
        with self._lock:
            return dict(self._state.assigned)

    @property
    def remaining(self) -> int:
        """Scripted turns not used yet (cycling scripts count none)."""
        with self._lock:
            if isinstance(self.script, Script):
                pairs = [(self.script, self._state.positions.get(None, 0))]
            else:
                pairs = []
                for i, script in enumerate(self.script.scripts):
                    sessions = [s for s, j in self._state.assigned.items() if j == i]
                    pairs += [(script, self._state.positions.get(s, 0)) for s in sessions]
                    if not sessions:
                        pairs.append((script, 0))
            return sum(len(s.turns) - used for s, used in pairs if not s.cycle)

    def assert_clean(self, *, finished: bool = True) -> None:
        """Raise if any request mismatched, or (``finished``) turns were left unused."""
        failures = self.failures
        if failures:
            raise AssertionError("scripted engine saw mismatches:\n" + "\n".join(failures))
        if finished and self.remaining:
            raise AssertionError(f"scripted engine has {self.remaining} unused turns")

    # ---------------------------------------------------------------- script

    def _script_for(self, session: str | None) -> tuple[Script, str | None, str]:
        """(script, state key, how to name it in messages); lock held."""
        if isinstance(self.script, Script):
            return self.script, None, "the script"
        if session is None:
            raise ScriptMismatch(f"per-session scripts need the {SESSION_HEADER} header")
        index = self._state.assigned.get(session)
        if index is None:
            scripts = self.script.scripts
            matching = [i for i, s in enumerate(scripts) if s.session and s.session.search(session)]
            if matching:
                index = matching[0]
            else:
                free = [i for i, s in enumerate(scripts) if s.session is None]
                if self._state.taken >= len(free):
                    raise ScriptMismatch(
                        f"session {session} is session {self._state.taken + 1} without a "
                        f"pattern of its own, but there are only {len(free)} such session scripts"
                    )
                index = free[self._state.taken]
                self._state.taken += 1
            self._state.assigned[session] = index
        return self.script.scripts[index], session, f"session script {index}"

    def _next_turn(self, body: dict[str, Any], seen: ObservedRequest, session: str | None) -> Turn:
        with self._lock:
            self._state.requests.append(body)
            self._state.sessions.append(session)
            try:
                script, key, name = self._script_for(session)
            except ScriptMismatch as exc:
                self._state.failures.append(str(exc))
                raise
            side = script.side_reply(seen)
            if side is not None:
                return side
            index = self._state.positions.get(key, 0)
            turns = script.turns
            if index >= len(turns) and not script.cycle:
                message = f"request {index + 1} arrived but {name} has only {len(turns)} turns"
                self._state.failures.append(message)
                raise ScriptMismatch(message)
            turn = turns[index % len(turns)]
            problems = turn.expect.problems(seen) if turn.expect else []
            if problems:
                message = f"request {index + 1} does not match {name}: " + "; ".join(problems)
                self._state.failures.append(message)
                raise ScriptMismatch(message)
            self._state.positions[key] = index + 1
            return turn

    def _fail(self, message: str) -> Response:
        with self._lock:
            self._state.failures.append(message)
        return _error(f"scripted engine: {message}", 500, "ScriptMismatch")

    # ---------------------------------------------------------------- routes

    async def _health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def _models(self, request: Request) -> Response:
        return _json(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.model,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "vllm",
                        "root": self.model,
                        "parent": None,
                        "max_model_len": self.max_model_len,
                    }
                ],
            }
        )

    async def _update_weights(self, request: Request) -> Response:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            return _json({"detail": "There was an error parsing the body"}, 400)
        with self._lock:
            status, reply, version = sglang_wire.weights_update(body, self._state.weight_version)
            if status == 200:
                self._state.weight_version = version
                self._state.model_path = str(body["model_path"])
                self._state.weight_updates.append(dict(body))
        return _json(reply, status)

    async def _model_info(self, request: Request) -> Response:
        with self._lock:
            return _json(sglang_wire.model_info(self._state.model_path, self._state.weight_version))

    async def _tokenize(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        if "messages" in body:
            ids = vllm_wire.render_prompt(self.tokenizer, body)
        else:
            ids = list(self.tokenizer.encode(body["prompt"], add_special_tokens=False))
        return _json(
            {
                "count": len(ids),
                "max_model_len": self.max_model_len,
                "tokens": ids,
                "token_strs": None,
            }
        )

    async def _chat(self, request: Request) -> Response:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            return _error(f"invalid JSON: {exc}", 400, "Bad Request")
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
        tools = body.get("tools") or []
        seen = ObservedRequest(
            messages=body.get("messages") or [],
            tool_names=tuple((t.get("function") or {}).get("name", "") for t in tools),
        )
        try:
            turn = self._next_turn(body, seen, request.headers.get(SESSION_HEADER))
        except ScriptMismatch as exc:
            return _error(f"scripted engine: {exc}", 500, "ScriptMismatch")
        if body.get("stop"):
            return self._fail(
                "the request has stop strings, which the scripted engine does not emulate"
            )
        try:
            prompt = vllm_wire.render_prompt(self.tokenizer, body)
            max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
            if turn.max_tokens is not None:
                max_tokens = min(max_tokens or turn.max_tokens, turn.max_tokens)
            gen = vllm_wire.generate(
                self.tokenizer,
                turn.output_text(),
                max_tokens=max_tokens,
                force_length=turn.finish == "length",
            )
        except ValueError as exc:
            return self._fail(str(exc))
        tools_offered = bool(tools) and body.get("tool_choice") != "none"
        if self.wire == "sglang":
            return _json(
                sglang_wire.whole_response(
                    self.tokenizer,
                    body,
                    prompt,
                    gen,
                    tools_offered=tools_offered,
                    model=self.model,
                    weight_version=self.weight_version,
                )
            )
        if body.get("stream"):
            return StreamingResponse(
                self._stream(body, prompt, gen, tools_offered, crash_after=turn.crash_after),
                media_type="text/event-stream",
            )
        return _json(self._whole(body, prompt, gen, tools_offered))

    # ---------------------------------------------------------------- token in

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
        turn = self._next_turn(body, seen, session)
        if turn.max_tokens is not None:
            max_tokens = min(max_tokens or turn.max_tokens, turn.max_tokens)
        try:
            gen = vllm_wire.generate(
                self.tokenizer,
                turn.output_text(),
                max_tokens=max_tokens,
                force_length=turn.finish == "length",
            )
        except ValueError as exc:
            raise ScriptMismatch(str(exc)) from None
        return turn, gen

    async def _completions(self, request: Request) -> Response:
        try:
            body = orjson.loads(await request.body())
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
            return _error(f"scripted engine: {exc}", 500, "ScriptMismatch")
        stops = list(body.get("stop_token_ids") or ())
        top = int(body.get("logprobs") or 0)
        head = {
            "id": f"cmpl-{secrets.token_hex(8)}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model,
        }
        usage = {
            "prompt_tokens": len(prompt),
            "total_tokens": len(prompt) + len(gen.ids),
            "completion_tokens": len(gen.ids),
        }
        if not body.get("stream"):
            choice = {
                "index": 0,
                "text": gen.text,
                "logprobs": vllm_wire.completion_logprobs(
                    self.tokenizer, gen, 0, len(gen.ids), 0, top
                ),
                "finish_reason": gen.finish,
                "stop_reason": vllm_wire.stop_reason(gen, stops),
                "token_ids": gen.ids,
                "prompt_logprobs": None,
                "prompt_token_ids": prompt,
                "routed_experts": None,
            }
            return _json(
                {
                    **head,
                    "choices": [choice],
                    "service_tier": None,
                    "system_fingerprint": vllm_wire.SYSTEM_FINGERPRINT,
                    "usage": {
                        **usage,
                        "prompt_tokens_details": None,
                        "completion_tokens_details": None,
                    },
                    "kv_transfer_params": None,
                    "ec_transfer_params": None,
                    "metrics": None,
                }
            )

        async def chunks() -> AsyncIterator[bytes]:
            offset = 0
            for i, piece in enumerate(gen.token_texts):
                if i == turn.crash_after:
                    raise ScriptedCrash(f"scripted crash after {i} tokens")
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
                last = i == len(gen.ids) - 1
                choice = {
                    "index": 0,
                    "text": piece,
                    "logprobs": vllm_wire.completion_logprobs(
                        self.tokenizer, gen, i, i + 1, offset, top
                    ),
                    "finish_reason": gen.finish if last else None,
                    "stop_reason": vllm_wire.stop_reason(gen, stops) if last else None,
                    "prompt_token_ids": prompt if i == 0 else None,
                    "token_ids": [gen.ids[i]],
                }
                offset += len(piece)
                yield b"data: " + orjson.dumps({**head, "choices": [choice]}) + b"\n\n"
            if (body.get("stream_options") or {}).get("include_usage"):
                tail = {
                    **head,
                    "choices": [],
                    "usage": usage,
                    "system_fingerprint": vllm_wire.SYSTEM_FINGERPRINT,
                }
                yield b"data: " + orjson.dumps(tail) + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    async def _generate(self, request: Request) -> Response:
        try:
            body = orjson.loads(await request.body())
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
        rid = secrets.token_hex(16)
        logprobs = {
            "top": int(body.get("top_logprobs_num") or 0) if body.get("return_logprob") else 0,
            "tokenizer": self.tokenizer,
            "with_text": bool(body.get("return_text_in_logprobs")),
        }
        if not body.get("stream"):
            meta = sglang_wire.generate_meta(
                gen,
                prompt,
                len(gen.ids),
                rid,
                final=True,
                weight_version=self.weight_version,
                **logprobs,
            )
            return _json({"text": gen.text, "output_ids": gen.ids, "meta_info": meta})

        async def chunks() -> AsyncIterator[bytes]:
            for i in range(len(gen.ids)):
                if i == turn.crash_after:
                    raise ScriptedCrash(f"scripted crash after {i} tokens")
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
                final = i == len(gen.ids) - 1
                chunk = {
                    "text": "".join(gen.token_texts[: i + 1]),
                    "output_ids": gen.ids[: i + 1],
                    "meta_info": sglang_wire.generate_meta(
                        gen,
                        prompt,
                        i + 1,
                        rid,
                        final=final,
                        weight_version=self.weight_version,
                        **logprobs,
                    ),
                }
                yield b"data: " + orjson.dumps(chunk) + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    # ---------------------------------------------------------------- replies

    def _details(self, body: dict[str, Any], gen: vllm_wire.Generation, i: int) -> dict[str, Any]:
        return vllm_wire.token_detail(
            self.tokenizer, gen.ids[i], gen.logprobs[i], int(body.get("top_logprobs") or 0)
        )

    def _whole(
        self,
        body: dict[str, Any],
        prompt: list[int],
        gen: vllm_wire.Generation,
        tools_offered: bool,
    ) -> dict[str, Any]:
        parsed = vllm_wire.parse_whole(gen, tools_offered=tools_offered)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": parsed.content,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
        }
        if tools_offered:
            message["tool_calls"] = parsed.tool_calls
        message["reasoning"] = parsed.reasoning
        finish = "tool_calls" if parsed.tool_calls and gen.finish == "stop" else gen.finish
        want_ids = bool(body.get("return_token_ids"))
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": (
                {"content": [self._details(body, gen, i) for i in range(len(gen.ids))]}
                if body.get("logprobs")
                else None
            ),
            "finish_reason": finish,
            "stop_reason": None,
            "token_ids": gen.ids if want_ids else None,
            "routed_experts": None,
        }
        return {
            "id": f"chatcmpl-{secrets.token_hex(8)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": vllm_wire.SYSTEM_FINGERPRINT,
            "usage": {
                "prompt_tokens": len(prompt),
                "total_tokens": len(prompt) + len(gen.ids),
                "completion_tokens": len(gen.ids),
                "prompt_tokens_details": None,
                "completion_tokens_details": {"reasoning_tokens": parsed.reasoning_tokens},
            },
            "prompt_logprobs": None,
            "prompt_token_ids": prompt if want_ids else None,
            "prompt_text": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }

    async def _stream(
        self,
        body: dict[str, Any],
        prompt: list[int],
        gen: vllm_wire.Generation,
        tools_offered: bool,
        *,
        crash_after: int | None,
    ) -> AsyncIterator[bytes]:
        head = {
            "id": f"chatcmpl-{secrets.token_hex(8)}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.model,
        }
        want_ids = bool(body.get("return_token_ids"))
        first: dict[str, Any] = {
            **head,
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
        }
        if want_ids:
            first["prompt_token_ids"] = prompt
        first["prompt_text"] = None
        if self.token_delay_s:
            await asyncio.sleep(self.token_delay_s)
        yield b"data: " + orjson.dumps(first) + b"\n\n"
        parser = vllm_wire.StreamParser(tools_offered=tools_offered)
        last = len(gen.ids) - 1
        for i, piece in enumerate(gen.token_texts):
            if i == crash_after:
                raise ScriptedCrash(f"scripted crash after {i} tokens")
            if self.token_delay_s:
                await asyncio.sleep(self.token_delay_s)
            choice: dict[str, Any] = {
                "index": 0,
                "delta": parser.feed(piece),
                "logprobs": (
                    {"content": [self._details(body, gen, i)]} if body.get("logprobs") else None
                ),
            }
            if i == last:
                finish = gen.finish
                if parser.tools_streamed and finish == "stop":
                    finish = "tool_calls"
                choice["finish_reason"] = finish
                choice["stop_reason"] = None
            else:
                choice["finish_reason"] = None
            if want_ids:
                choice["token_ids"] = [gen.ids[i]]
            yield b"data: " + orjson.dumps({**head, "choices": [choice]}) + b"\n\n"
        options = body.get("stream_options") or {}
        if options.get("include_usage"):
            usage = {
                **head,
                "choices": [],
                "usage": {
                    "prompt_tokens": len(prompt),
                    "total_tokens": len(prompt) + len(gen.ids),
                    "completion_tokens": len(gen.ids),
                    "completion_tokens_details": {"reasoning_tokens": parser.reasoning_tokens},
                },
                "system_fingerprint": vllm_wire.SYSTEM_FINGERPRINT,
            }
            yield b"data: " + orjson.dumps(usage) + b"\n\n"
        yield b"data: [DONE]\n\n"
