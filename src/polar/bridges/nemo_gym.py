"""NeMo Gym / NeMo RL: Polar as a NeMo Gym agent server (``POST /run``).

Follows NeMo Gym 0.5.1 (NVIDIA-NeMo/Gym at 07d6b0d): the agent-server
contract of ``nemo_gym/base_responses_api_agent.py`` and
``nemo_gym/base_resources_server.py`` (a ``BaseRunRequest`` carrying
``responses_create_params`` in, a ``BaseVerifyResponse`` — the request, a
Responses-API ``response`` and a ``reward`` — out) and the training output
items of ``nemo_gym/openai_utils.py`` (``TokenIDLogProbMixin``:
``prompt_token_ids``, ``generation_token_ids``, ``generation_log_probs``).

One ``/run`` is one rollout: the task is the row's ``polar_task`` (a task id)
or, failing that, what ``responses_create_params.input`` names (a task id or
its instruction, as a string or as messages whose last user message is it);
Polar runs it as one session (a group of one: NeMo RL repeats rows itself)
and answers with one ``message`` output item per model call of the session's
trace, in order (a call is cut in two around a sampled token the engine gave
no logprob for, which then counts as an environment token, counted in
``polar_missing_logprobs``). Each item carries the call's full prompt ids, its
sampled ids and their logprobs, so consecutive items chain the way NeMo Gym's own
``prefix_merging`` rebuilds a rollout (``nemo_gym/token_id_capture/builder.py``:
the tokens a prompt adds after the previous prompt and generation are
environment tokens, mask 0). The item's ``content`` text is empty: Polar
hands over token ids, not text. The ``reward`` is Polar's score; the row's
other fields are echoed, as NeMo Gym's agents do.

Failed sessions follow :mod:`polar.rollout.failure`: the agent's failure (a
timeout, its harness's exit, a sandbox limit) answers its partial trace's items
with reward 0.0 (response status ``incomplete``), and is trained. A session the
infrastructure failed (``failed``) or that was cancelled (``cancelled``) is
masked: no output item (nothing to train), reward 0.0 and ``polar_usable``
false; NeMo RL wants a float and normalises over its group, so that
placeholder still counts in the group's baseline: set ``max_resamples`` in the
bridge config so the rollout server replaces such sessions. The response's
``metadata`` names the session's use and failure reason.

NeMo Gym needs Python >= 3.12 and Polar 3.11, so this server runs in Polar's
environment (``python -m polar.bridges.nemo_gym polar-bridge.yaml``) and a
NeMo Gym config names it (``examples/nemo_gym/``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from itertools import groupby
from typing import Any, assert_never

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from polar.bridges.config import BridgeConfig, read_config
from polar.bridges.rollouts import (
    BridgeError,
    GroupRequest,
    PolarRollouts,
    SessionSample,
    group_sessions,
    logprob_loss_mask,
    missing_logprobs,
)
from polar.configfile import ConfigError, describe_error
from polar.rollout.failure import Fault, SessionUse
from polar.rollout.http import ApiError, body_of, error_response, not_found
from polar.trajectory import Sample


class NemoGymBridgeConfig(BridgeConfig):
    host: str = "127.0.0.1"
    port: int = Field(default=8300, ge=0, le=65535)
    max_concurrent_runs: int = Field(default=64, ge=1)
    """Rollouts run at once; further ``/run`` calls wait their turn."""


class ResponsesCreateParams(BaseModel):
    """The part of ``responses_create_params`` Polar reads (the rest is echoed)."""

    model_config = ConfigDict(extra="allow")
    input: str | list[dict[str, Any]] = Field(min_length=1)


class RunRequest(BaseModel):
    """NeMo Gym's ``BaseRunRequest``, plus an optional ``polar_task`` id."""

    model_config = ConfigDict(extra="allow")
    responses_create_params: ResponsesCreateParams
    polar_task: str | None = Field(default=None, min_length=1)


def input_prompt(params: ResponsesCreateParams) -> Any:
    """Responses-API ``input`` as what :func:`~polar.bridges.rollouts.prompt_text` reads."""
    if isinstance(params.input, str):
        return params.input
    messages = []
    for item in params.input:
        content = item.get("content")
        if isinstance(content, list):  # input_text parts
            content = [{"text": p.get("text")} for p in content if isinstance(p, dict)]
        messages.append({"role": item.get("role"), "content": content})
    return messages


def output_items(trace: Sample, item_prefix: str) -> list[dict[str, Any]]:
    """One training ``message`` item per model call of the trace, each a run of
    sampled tokens that have a logprob.

    NeMo Gym's items have no per-token mask and no "missing" logprob, and NeMo
    RL trains every generation token against its ``generation_log_probs``; so a
    sampled token the engine gave no logprob for ends its item, and the next
    item's prompt carries it: the trainer sees it as an environment token
    (mask 0), as it sees tool output (:func:`missing_logprobs` counts them).
    """
    items: list[dict[str, Any]] = []
    for turn in trace.turn_offsets:
        for start, end in _logprob_runs(trace, turn.sampled_start, turn.end):
            items.append(
                {
                    "id": f"{item_prefix}_{len(items)}",
                    "type": "message",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "", "annotations": []}],
                    "prompt_token_ids": [*trace.prompt_ids, *trace.response_ids[:start]],
                    "generation_token_ids": list(trace.response_ids[start:end]),
                    "generation_log_probs": list(trace.rollout_logprobs[start:end]),
                }
            )
    return items


MASKED_REWARD = 0.0
"""The reward of a masked session (NeMo Gym wants a float)."""


def response_status(session: SessionSample) -> str:
    """The Responses-API status: ``completed`` when scored, ``incomplete`` for the
    agent's failure, ``cancelled`` or ``failed`` when masked."""
    match session.use:
        case SessionUse.SCORED:
            return "completed"
        case SessionUse.FAILED:
            return "incomplete"
        case SessionUse.MASKED:
            failure = session.session.failure
            return "cancelled" if failure is not None and failure.fault is Fault.NONE else "failed"
        case unreachable:
            assert_never(unreachable)


def _logprob_runs(trace: Sample, start: int, end: int) -> list[tuple[int, int]]:
    """The maximal ``[a, b)`` within ``[start, end)`` whose tokens are all trained
    and have a logprob (a token under loss mask 0, say one whose distribution the
    trainer cannot reproduce, goes to the next item's prompt like a missing one)."""
    trained = logprob_loss_mask(trace)
    runs = []
    for has, group in groupby(range(start, end), key=lambda i: bool(trained[i])):
        if has:
            positions = list(group)
            runs.append((positions[0], positions[-1] + 1))
    return runs


def verify_response(request: dict[str, Any], session: SessionSample, model: str) -> dict[str, Any]:
    """NeMo Gym's ``BaseVerifyResponse`` for one session."""
    trace = session.trace
    s = session.session
    reward = session.reward  # None: masked
    items = (
        output_items(trace, f"msg_{s.session_id}")
        if trace is not None and reward is not None
        else []
    )
    generated = sum(len(i["generation_token_ids"]) for i in items)
    prompt = len(items[-1]["prompt_token_ids"]) if items else 0
    response = {
        "id": f"resp_{s.session_id}",
        "object": "response",
        "created_at": time.time(),
        "model": model,
        "status": response_status(session),
        "output": items,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": generated,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + generated,
        },
        "metadata": {
            "polar_session": s.session_id,
            "polar_task": s.task_id,
            "polar_group": session.group_id,
            "polar_status": s.status.value,
            "polar_use": session.use.value,
            **({"polar_failure": session.failure} if session.failure is not None else {}),
            **({"polar_error": s.error[:512]} if s.error else {}),
        },
    }
    return {
        **request,
        "response": response,
        "reward": MASKED_REWARD if reward is None else reward,
        "polar_usable": session.usable,
        "polar_traces": session.traces,
        "polar_undelivered_tokens": session.undelivered_tokens,
        "polar_missing_logprobs": missing_logprobs(trace) if trace is not None else 0,
    }


def create_app(config: NemoGymBridgeConfig, *, rollouts: PolarRollouts | None = None) -> Starlette:
    bridge = rollouts or PolarRollouts(config)
    slots = asyncio.Semaphore(config.max_concurrent_runs)

    async def run(request: Request) -> Response:
        try:
            body = await body_of(request, RunRequest)
            raw = body.model_dump(mode="json", exclude_none=True)
            try:
                task = bridge.task_for(
                    body.polar_task or input_prompt(body.responses_create_params)
                )
            except BridgeError as exc:
                raise ApiError(422, str(exc)) from None
            group = GroupRequest(task=task, num_samples=1, metadata={"trainer": "nemo_gym"})
            async with slots:
                try:
                    (result,) = await asyncio.to_thread(bridge.run, [group])
                except BridgeError as exc:
                    raise ApiError(502, str(exc), "rollout_failed") from None
            (session,) = group_sessions(result, config.trace)
            model = str(raw["responses_create_params"].get("model") or "polar")
            return JSONResponse(verify_response(raw, session, model))
        except ApiError as exc:
            return error_response(exc)

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            bridge.close()

    return Starlette(
        routes=[Route("/run", run, methods=["POST"]), Route("/health", health, methods=["GET"])],
        exception_handlers={404: not_found},
        lifespan=lifespan,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m polar.bridges.nemo_gym CONFIG [--host H] [--port P]``."""
    parser = argparse.ArgumentParser(prog="python -m polar.bridges.nemo_gym")
    parser.add_argument("config", help="the bridge config (YAML)")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    args = parser.parse_args(argv)
    try:
        config = read_config(NemoGymBridgeConfig, args.config)
        overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
        if overrides:
            config = NemoGymBridgeConfig.model_validate({**config.model_dump(), **overrides})
    except ConfigError as exc:
        parser.exit(2, f"error: {exc}\n")
    except ValidationError as exc:
        parser.exit(2, f"error: {describe_error(exc)}\n")
    import uvicorn

    uvicorn.run(create_app(config), host=config.host, port=config.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
