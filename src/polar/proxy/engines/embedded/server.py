"""The embedded CPU engine's HTTP API: the token-in subset of vLLM's completions route.

``POST /v1/completions`` takes a token-id ``prompt`` and answers exactly as
vLLM does with ``return_token_ids`` (so the gateway drives it with the same
client as vLLM); ``POST /weights {"path", "version"?}`` loads new weights in
place (full weights, or LoRA adapters merged in place; ``version``: the
trainer's policy version, reported back); ``GET /weights`` reports what is
loaded (device, dtype, versions, adapter); ``GET /v1/models``, ``GET /health``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from polar.proxy.engines import vllm_protocol as wire
from polar.proxy.engines.embedded.runner import Job, ModelRunner, SamplingParams, Step, describe


class CompletionRequest(BaseModel):
    """The fields of vLLM's completions request the embedded engine honours."""

    model_config = ConfigDict(extra="ignore")
    model: str
    prompt: list[int] = Field(min_length=1)
    max_tokens: int = Field(default=16, ge=1)
    # Unset: the model's generation_config.json default, else the neutral one (as vLLM)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    seed: int | None = None
    stop_token_ids: list[int] = Field(default_factory=list)
    stop: str | list[str] | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: int | None = Field(default=None, ge=0, le=20)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0


def _json(body: Any, status: int = 200) -> Response:
    return Response(wire.encode(body), status_code=status, media_type="application/json")


def _error(message: str, status: int = 400, param: str | None = None) -> Response:
    return _json(wire.error_body(message, status, param=param), status)


@dataclass(frozen=True, slots=True)
class _Served:
    """What the handlers reach through ``app.state.served``."""

    runner: ModelRunner
    name: str


def create_engine_app(runner: ModelRunner, *, served_name: str) -> Starlette:
    app = Starlette(
        routes=[
            Route(wire.HEALTH_PATH, _health, methods=["GET"]),
            Route(wire.MODELS_PATH, _models, methods=["GET"]),
            Route(wire.COMPLETIONS_PATH, _completions, methods=["POST"]),
            Route("/weights", _weights, methods=["GET", "POST"]),
        ]
    )
    app.state.served = _Served(runner, served_name)
    return app


def _served(request: Request) -> _Served:
    served: _Served = request.app.state.served
    return served


async def _health(request: Request) -> Response:
    return Response(status_code=200)


async def _models(request: Request) -> Response:
    served = _served(request)
    return _json(
        wire.model_list(
            served.name,
            max_model_len=served.runner.max_model_len,
            owned_by="polar",
            created=0,
        )
    )


async def _weights(request: Request) -> Response:
    runner = _served(request).runner
    if request.method == "GET":
        return _json(describe(runner))
    try:
        body = orjson.loads(await request.body())
        path = Path(body["path"])
        policy = body.get("version")
        if policy is not None and (not isinstance(policy, int) or isinstance(policy, bool)):
            raise TypeError
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        return _error(
            'expected {"path": "<model dir, .safetensors file or adapter dir>", '
            '"version": <int, optional>}'
        )
    try:
        version = await asyncio.to_thread(runner.load_weights, path, policy_version=policy)
    except (FileNotFoundError, ValueError, RuntimeError) as exc:
        return _error(str(exc))
    return _json({**describe(runner), "weights_version": version})


# ---------------------------------------------------------------- completions


async def _completions(request: Request) -> Response:
    served = _served(request)
    try:
        req = CompletionRequest.model_validate(orjson.loads(await request.body()))
    except orjson.JSONDecodeError as exc:
        return _error(f"invalid JSON: {exc}")
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return _error(f"{where}: {first['msg']}", param=where)
    refusal = _refusal(req, served)
    if refusal is not None:
        return refusal
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Step] = asyncio.Queue()

    def emit(step: Step) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, step)

    job = Job(prompt=list(req.prompt), params=_sampling(req, served.runner), emit=emit)
    served.runner.submit(job)
    head = wire.head("text_completion", served.name)
    if req.stream:
        return StreamingResponse(
            _stream(job, queue, head, req, served.runner), media_type="text/event-stream"
        )
    return await _whole(job, queue, head, req, served.runner)


def _refusal(req: CompletionRequest, served: _Served) -> Response | None:
    """The error reply to a request this engine cannot serve (``None``: it can)."""
    if req.model != served.name:
        return _error(
            f"The model `{req.model}` does not exist. Valid aliases: {served.name}.",
            404,
            "model",
        )
    unsupported = _unsupported(req)
    if unsupported:
        return _error(f"the embedded engine does not support: {', '.join(unsupported)}")
    runner = served.runner
    if any(t < 0 or t >= runner.vocab_size for t in req.prompt):
        return _error(f"prompt token ids must be in [0, {runner.vocab_size})", param="prompt")
    if len(req.prompt) + req.max_tokens > runner.max_model_len:
        return _error(
            f"This model's maximum context length is {runner.max_model_len} tokens. However, "
            f"you requested {len(req.prompt) + req.max_tokens} tokens "
            f"({len(req.prompt)} in the prompt, {req.max_tokens} for the completion).",
            param="max_tokens",
        )
    if not runner.fits(len(req.prompt), req.max_tokens):
        need = runner.memory_needed(len(req.prompt), req.max_tokens)
        return _error(
            f"This request needs about {need / 2**20:,.0f} MiB of engine memory "
            f"({len(req.prompt)} prompt tokens, {req.max_tokens} to generate), more than "
            f"the embedded engine's limit of {runner.max_memory_bytes / 2**20:,.0f} MiB "
            "(polar engine serve --max-memory-gib). Ask for fewer tokens or raise the limit.",
            param="max_tokens",
        )
    return None


def _unsupported(req: CompletionRequest) -> list[str]:
    """The request's fields set to something other than what this engine implements."""
    unsupported = [
        name
        for name, value, default in (
            ("n", req.n, 1),
            ("presence_penalty", req.presence_penalty, 0.0),
            ("frequency_penalty", req.frequency_penalty, 0.0),
            ("repetition_penalty", req.repetition_penalty, 1.0),
        )
        if value != default
    ]
    if req.stop:
        unsupported.append("stop (use stop_token_ids)")
    return unsupported


def _sampling(req: CompletionRequest, runner: ModelRunner) -> SamplingParams:
    """The request's sampling; unset fields take the model's defaults (as vLLM)."""
    defaults = runner.default_sampling
    top_k = req.top_k if req.top_k is not None else defaults.top_k
    return SamplingParams(
        max_tokens=req.max_tokens,
        temperature=req.temperature if req.temperature is not None else defaults.temperature,
        top_p=req.top_p if req.top_p is not None else defaults.top_p,
        top_k=max(top_k, 0),
        min_p=req.min_p if req.min_p is not None else defaults.min_p,
        seed=req.seed,
        stop_token_ids=frozenset(req.stop_token_ids),
        logit_bias=tuple((int(k), float(v)) for k, v in (req.logit_bias or {}).items()),
    )


async def _whole(
    job: Job,
    queue: asyncio.Queue[Step],
    head: dict[str, Any],
    req: CompletionRequest,
    runner: ModelRunner,
) -> Response:
    """Wait for the whole generation and answer it as one completion."""
    ids: list[int] = []
    logprobs: list[float] = []
    try:
        while True:
            step = await queue.get()
            if step.error is not None:
                return _error(f"engine failure: {step.error}", 500)
            if step.token_id is not None and step.logprob is not None:
                ids.append(step.token_id)
                logprobs.append(step.logprob)
            if step.finish is not None:
                break
    except asyncio.CancelledError:
        job.cancelled.set()
        raise
    reply = wire.completion(
        head,
        text="",
        logprobs=_logprobs(ids, logprobs) if req.logprobs is not None else None,
        finish_reason=step.finish,
        stop_reason=_stop_reason(ids, step, req, runner),
        token_ids=ids,
        prompt_token_ids=req.prompt,
    )
    return _json(reply)


def _logprobs(ids: list[int], values: list[float]) -> dict[str, Any]:
    # Token text is the gateway's business (it has the tokenizer); ids are exact.
    return wire.completion_logprobs([str(i) for i in ids], values)


def _stop_reason(ids: list[int], step: Step, req: CompletionRequest, runner: ModelRunner) -> Any:
    if (
        step.finish == "stop"
        and ids
        and ids[-1] in req.stop_token_ids
        and ids[-1] not in runner.eos_ids
    ):
        return ids[-1]
    return None


async def _stream(
    job: Job,
    queue: asyncio.Queue[Step],
    head: dict[str, Any],
    req: CompletionRequest,
    runner: ModelRunner,
) -> AsyncIterator[bytes]:
    want_logprobs = req.logprobs is not None
    produced = 0
    try:
        while True:
            step = await queue.get()
            if step.error is not None:
                yield wire.event(wire.stream_error(f"engine failure: {step.error}", 500))
                return
            ids = [step.token_id] if step.token_id is not None else []
            values = [step.logprob] if step.logprob is not None else []
            produced += len(ids)
            chunk = wire.completion_chunk(
                head,
                text="",
                logprobs=_logprobs(ids, values) if want_logprobs else None,
                finish_reason=step.finish,
                stop_reason=_stop_reason(ids, step, req, runner),  # on the finishing event
                prompt_token_ids=req.prompt if produced <= 1 and ids else None,
                token_ids=ids,
            )
            yield wire.event(chunk)
            if step.finish is not None:
                break
        if (req.stream_options or {}).get("include_usage"):
            yield wire.event(wire.usage_event(head, wire.usage(len(req.prompt), produced)))
        yield wire.DONE_EVENT
    finally:
        # The client went away (or we are done): stop generating for it.
        job.cancelled.set()
