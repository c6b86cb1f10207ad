"""Trainer samples and task results made by hand, for the GRPO and batch tests."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import orjson

from polar.ir import Distribution, Unreproducible
from polar.ir.behaviour import MODEL
from polar.proxy.engines.embedded import ModelRunner, create_engine_app
from polar.rollout.failure import FailureReason
from polar.rollout.protocol import SessionResult, SessionStatus, TaskResult, TaskStatus
from polar.serverthread import ServerThread
from polar.trajectory import ChainClass
from polar.trajectory.export import Sample, row_of
from polar.trajectory.trace import TurnSpan


def sample(
    session: str,
    prompt: Sequence[int],
    response: Sequence[int],
    *,
    mask: Sequence[int] | None = None,
    logprobs: Sequence[float] | None = None,
    logprob_mask: Sequence[int] | None = None,
    version: int = 0,
    segment: int = 0,
    reward: float | None = None,
    reward_scale: float = 1.0,
    sampling: Distribution | Unreproducible = MODEL,
) -> Sample:
    n = len(response)
    return Sample(
        trace_id=f"{session}/0.{segment}",
        session_id=session,
        group_id="g",
        builder="prefix_merge",
        chain=0,
        segment=segment,
        chain_class=ChainClass.MAIN,
        break_reason=None,
        trainable=True,
        policy_version=version,
        prompt_ids=tuple(prompt),
        response_ids=tuple(response),
        loss_mask=tuple(mask if mask is not None else [1] * n),
        rollout_logprobs=tuple(logprobs if logprobs is not None else [-1.0] * n),
        logprob_mask=tuple(logprob_mask if logprob_mask is not None else [1] * n),
        reward=reward,
        reward_scale=reward_scale,
        finish_reason=None,
        source_records=(f"{session}/1.1",),
        turn_offsets=(TurnSpan(f"{session}/1.1", 0, 0, n),),
        truncated_turns=0,
        malformed_tool_calls=0,
        sampling=sampling,
    )


def session_result(
    session: str,
    reward: float | None,
    samples: Sequence[Sample],
    *,
    status: SessionStatus = SessionStatus.COMPLETED,
    failure: FailureReason | None = None,
    index: int = 0,
) -> SessionResult:
    """``failure`` None for a failed ``status``: what the status meant before reasons."""
    # as the node sends them: JSON rows
    rows: list[dict[str, Any]] = [orjson.loads(orjson.dumps(row_of(s))) for s in samples]
    return SessionResult(
        session_id=session,
        task_id="task-1",
        sample_index=index,
        status=status,
        reward=reward,
        failure=failure,
        samples=rows,
    )


def task_result(results: Sequence[SessionResult], *, version: int | None = 0) -> TaskResult:
    return TaskResult(
        task_id="task-1",
        task="t",
        group_id="g",
        status=TaskStatus.COMPLETED,
        policy_version=version,
        results=list(results),
        usable=sum(1 for r in results if r.usable),
    )


# ---------------------------------------------------------------- a stand-in agent that talks

TALKER = r"""
import json, os, random, sys, urllib.request

def chat(messages):
    body = {"model": os.environ["OPENAI_MODEL"], "messages": messages, "max_tokens": 10}
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                 "content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as reply:
        return json.load(reply)["choices"][0]["message"]

messages = [{"role": "user", "content": "Say something about " + sys.argv[1] + "."}]

def turn():
    message = chat(messages)
    messages.append({"role": "assistant", "content": message.get("content") or ""})
    messages.append({"role": "user", "content": "Go on."})

if sys.argv[1] == "quick":
    turn()
    turn()
else:
    # talk until the test drops a file named "stop" here, then once more
    while True:
        last = os.path.exists("stop")
        turn()
        if last:
            break
open("score.txt", "w").write(str(random.random()))
"""
"""A conversation with the model through the gateway (OpenAI chat, ``urllib`` only).
``quick``: two turns. Otherwise: turns until a file ``stop`` appears in the
workspace, then one more. The reward is a uniform random number it writes to
``score.txt`` (the evaluator copies it to its reward file), so a group's rewards
differ and advantages are not zero: this drives the training loop's plumbing,
it is not a task to learn."""


def talker_task(
    root: Path, task_id: str, mode: str, *, reward: float | None = None
) -> dict[str, Any]:
    """A task row (as in a JSONL task file) running :data:`TALKER` in ``mode``;
    scored with the talker's random number, or ``reward`` for every session."""
    workspace = root / f"{task_id}-workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "agent.py").write_text(TALKER)
    return {
        "id": task_id,
        "instruction": mode,
        "workspace": {"kind": "directory", "path": str(workspace)},
        "evaluator": {
            "kind": "command",
            "config": {
                "command": "cp score.txt reward.txt"
                if reward is None
                else f"echo {reward} > reward.txt",
                "reward_file": "reward.txt",
            },
            "timeout_s": 60,
        },
    }


TALKER_HARNESS = {"name": "shell", "options": {"command": "python3 agent.py {instruction}"}}


def greedy_next(url: str, prompt: list[int], model: str = "tiny") -> tuple[int, float]:
    """An engine's (vLLM's API) greedy next token after ``prompt`` and its logprob."""
    reply = httpx.post(
        f"{url}/v1/completions",
        json={
            "model": model,
            "prompt": prompt,
            "max_tokens": 1,
            "temperature": 0,
            "logprobs": 0,
            "return_token_ids": True,
        },
        timeout=120,
    )
    reply.raise_for_status()
    choice = reply.json()["choices"][0]
    return int(choice["token_ids"][0]), float(choice["logprobs"]["token_logprobs"][0])


class GatedEngine:
    """A pass-through in front of an engine (any path, streamed back as it comes)
    with a gate: while it is closed, the ``POST`` calls whose JSON body it was
    told to hold wait before reaching the engine (counted in :attr:`held`), so
    a test can keep one call in flight at the gateway for as long as it likes;
    every other request passes."""

    def __init__(self, upstream: str) -> None:
        from starlette.applications import Starlette
        from starlette.routing import Route

        self.upstream = upstream
        self._open = threading.Event()
        self._open.set()
        self._hold: Callable[[Any], bool] = lambda body: False
        self._lock = threading.Lock()
        self.held = 0
        app = Starlette(routes=[Route("/{path:path}", self._forward, methods=["GET", "POST"])])
        self.server = ServerThread(app).start()
        self.url = self.server.url

    def close_gate(self, hold: Callable[[Any], bool]) -> None:
        """Hold the calls whose parsed JSON body ``hold`` picks, until :meth:`open_gate`."""
        self._hold = hold
        self._open.clear()

    def open_gate(self) -> None:
        self._open.set()

    async def _forward(self, request: Any) -> Any:
        from starlette.responses import StreamingResponse

        content = await request.body()
        if request.method == "POST" and not self._open.is_set() and self._hold(_json(content)):
            with self._lock:
                self.held += 1
            await asyncio.to_thread(self._open.wait)
            with self._lock:
                self.held -= 1
        client = httpx.AsyncClient(timeout=None)
        headers = {
            k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")
        }
        upstream = await client.send(
            client.build_request(
                request.method,
                f"{self.upstream}{request.url.path}",
                params=request.query_params,
                content=content,
                headers=headers,
            ),
            stream=True,
        )

        async def body() -> AsyncIterator[bytes]:
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            finally:
                await upstream.aclose()
                await client.aclose()

        passed = {
            k: v
            for k, v in upstream.headers.items()
            if k.lower() not in ("content-length", "transfer-encoding", "connection")
        }
        return StreamingResponse(body(), status_code=upstream.status_code, headers=passed)

    def close(self) -> None:
        self._open.set()
        self.server.stop()


def _json(content: bytes) -> Any:
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        return None


class EmbeddedEngine:
    """The embedded engine serving ``model`` on a local port (as ``polar engine serve``)."""

    def __init__(self, model: Path) -> None:
        self.runner = ModelRunner(model, max_batch=8)
        self.server = ServerThread(create_engine_app(self.runner, served_name="tiny")).start()
        self.url = self.server.url

    def close(self) -> None:
        self.server.stop()
        self.runner.close()
