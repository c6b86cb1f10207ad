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
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

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
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def _error(message: str, status: int = 400, param: str | None = None) -> Response:
    kind = "BadRequestError" if status == 400 else "NotFoundError" if status == 404 else "Error"
    return _json(
        {"error": {"message": message, "type": kind, "param": param, "code": status}}, status
    )


def create_engine_app(runner: ModelRunner, *, served_name: str) -> Starlette:
    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def models(request: Request) -> Response:
        return _json(
            {
                "object": "list",
                "data": [
                    {
                        "id": served_name,
                        "object": "model",
                        "created": 0,
                        "owned_by": "polar",
                        "max_model_len": runner.max_model_len,
                    }
                ],
            }
        )

    async def weights(request: Request) -> Response:
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

    async def completions(request: Request) -> Response:
        try:
            req = CompletionRequest.model_validate(orjson.loads(await request.body()))
        except orjson.JSONDecodeError as exc:
            return _error(f"invalid JSON: {exc}")
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            return _error(f"{where}: {first['msg']}", param=where)
        if req.model != served_name:
            return _error(
                f"The model `{req.model}` does not exist. Valid aliases: {served_name}.",
                404,
                "model",
            )
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
        if unsupported:
            return _error(f"the embedded engine does not support: {', '.join(unsupported)}")
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
        defaults = runner.default_sampling
        top_k = req.top_k if req.top_k is not None else defaults.top_k
        params = SamplingParams(
            max_tokens=req.max_tokens,
            temperature=req.temperature if req.temperature is not None else defaults.temperature,
            top_p=req.top_p if req.top_p is not None else defaults.top_p,
            top_k=max(top_k, 0),
            min_p=req.min_p if req.min_p is not None else defaults.min_p,
            seed=req.seed,
            stop_token_ids=frozenset(req.stop_token_ids),
            logit_bias=tuple((int(k), float(v)) for k, v in (req.logit_bias or {}).items()),
        )
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Step] = asyncio.Queue()

        def emit(step: Step) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, step)

        job = Job(prompt=list(req.prompt), params=params, emit=emit)
        runner.submit(job)
        head = {
            "id": f"cmpl-{secrets.token_hex(8)}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": served_name,
        }
        want_logprobs = req.logprobs is not None
        if req.stream:
            return StreamingResponse(
                _stream(job, queue, head, req, want_logprobs), media_type="text/event-stream"
            )
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
        choice = {
            "index": 0,
            "text": "",
            "logprobs": _logprobs(ids, logprobs) if want_logprobs else None,
            "finish_reason": step.finish,
            "stop_reason": _stop_reason(ids, step, req, runner),
            "token_ids": ids,
            "prompt_token_ids": req.prompt,
        }
        usage = {
            "prompt_tokens": len(req.prompt),
            "total_tokens": len(req.prompt) + len(ids),
            "completion_tokens": len(ids),
        }
        return _json({**head, "choices": [choice], "usage": usage})

    return Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/weights", weights, methods=["GET", "POST"]),
        ]
    )


def _logprobs(ids: list[int], values: list[float]) -> dict[str, Any]:
    # Token text is the gateway's business (it has the tokenizer); ids are exact.
    return {"token_logprobs": values, "tokens": [str(i) for i in ids]}


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
    want_logprobs: bool,
) -> AsyncIterator[bytes]:
    produced = 0
    try:
        while True:
            step = await queue.get()
            if step.error is not None:
                error = {"error": {"message": f"engine failure: {step.error}", "code": 500}}
                yield b"data: " + orjson.dumps(error) + b"\n\n"
                return
            ids = [step.token_id] if step.token_id is not None else []
            values = [step.logprob] if step.logprob is not None else []
            produced += len(ids)
            choice = {
                "index": 0,
                "text": "",
                "logprobs": _logprobs(ids, values) if want_logprobs else None,
                "finish_reason": step.finish,
                "stop_reason": None,
                "prompt_token_ids": req.prompt if produced <= 1 and ids else None,
                "token_ids": ids,
            }
            yield b"data: " + orjson.dumps({**head, "choices": [choice]}) + b"\n\n"
            if step.finish is not None:
                break
        if (req.stream_options or {}).get("include_usage"):
            usage = {
                "prompt_tokens": len(req.prompt),
                "total_tokens": len(req.prompt) + produced,
                "completion_tokens": produced,
            }
            yield b"data: " + orjson.dumps({**head, "choices": [], "usage": usage}) + b"\n\n"
        yield b"data: [DONE]\n\n"
    finally:
        # The client went away (or we are done): stop generating for it.
        job.cancelled.set()
