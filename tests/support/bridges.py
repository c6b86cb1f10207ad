"""Polar as a user runs it under a trainer, for the bridge tests.

The embedded CPU engine serves the tiny model (random weights, the real
Qwen3 tokenizer) with the gateway in token-in/token-out mode; a rollout server
and a gateway node run sessions in the real ``local`` runtime (bubblewrap).
The agent is a real process run by the ``shell`` harness inside the sandbox:
a small program that talks to the gateway over HTTP in two turns (its first
reply, then an environment message, then a second reply), like an agent with
one tool round, and writes its final answer to a file; the task's command
evaluator scores the answer, so rewards vary with what the model sampled.

:func:`expected_from_records` rebuilds what a trainer must receive for a
session from the gateway's record store alone (not from Polar's builder):
the first call's prompt, then everything up to the last call's prompt plus
its sampled ids, the mask 1 exactly on sampled ids, their logprobs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polar.bridges.config import BridgeConfig
from polar.ir import CompletionRecord, RecordStatus
from polar.ir.behaviour import MODEL
from polar.proxy.engines.embedded import ModelRunner, create_engine_app
from polar.proxy.store import SqliteStore
from polar.rollout.client import RolloutClient
from polar.rollout.protocol import SessionResult, SessionStatus, TaskResult
from polar.serverthread import ServerThread
from polar.tinymodel.build import build_tiny_model
from polar.trajectory import ChainClass, TurnSpan, row_of
from polar.trajectory import Sample as PolarSample

from support.rollout import CONTROL_TOKEN, RolloutStack

AGENT = r"""
import json, os, sys, urllib.request

def chat(messages):
    body = {"model": os.environ["OPENAI_MODEL"], "messages": messages,
            "max_tokens": 10, "temperature": 1.0}
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                 "content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as reply:
        return json.load(reply)["choices"][0]["message"]

def as_history(message):
    turn = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("tool_calls"):
        turn["tool_calls"] = message["tool_calls"]
    return turn

messages = [{"role": "system", "content": "You are a terse coding agent."},
            {"role": "user", "content": sys.argv[1]}]
first = chat(messages)
messages.append(as_history(first))
for call in first.get("tool_calls") or []:
    messages.append({"role": "tool", "tool_call_id": call["id"], "content": "ok"})
messages.append({"role": "user", "content": "The shell printed: notes.md main.py. Answer now."})
second = chat(messages)
# An untrained model's reply is often all reasoning (no closing </think>): keep both.
answer = (second.get("reasoning_content") or "") + (second.get("content") or "")
open("answer.txt", "w").write(answer)
"""

SCORE = (
    "python3 -c \"import pathlib; p = pathlib.Path('answer.txt'); "
    "t = p.read_text() if p.exists() else ''; "
    "open('reward', 'w').write(str((len(t) % 3) / 2))\""
)

INSTRUCTIONS = {
    "rename-a": "Rename the function a to alpha.",
    "rename-b": "Rename the function b to beta.",
    "fix-typo": "Fix the typo in README.md.",
    "add-test": "Add a test for main.py.",
}


def write_tasks(root: Path) -> Path:
    """A task file: each task's workspace holds the agent; scored from its answer."""
    workspace = root / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "agent.py").write_text(AGENT)
    (workspace / "main.py").write_text("def a():\n    return 1\n")
    rows = [
        {
            "id": task_id,
            "instruction": instruction,
            "workspace": {"kind": "directory", "path": str(workspace)},
            "evaluator": {
                "kind": "command",
                "config": {"command": SCORE, "reward_file": "reward"},
                "timeout_s": 60,
            },
        }
        for task_id, instruction in INSTRUCTIONS.items()
    ]
    path = root / "tasks.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


HARNESS = {"name": "shell", "options": {"command": "python3 agent.py {instruction}"}}


@dataclass
class BridgeStack:
    """The embedded engine, a rollout server and a node; ``config`` reaches them."""

    root: Path
    model_dir: Path
    runner: ModelRunner
    engine: ServerThread
    rollout: RolloutStack
    tasks: Path

    @property
    def engine_url(self) -> str:
        return self.engine.url

    def config(self, **fields: Any) -> dict[str, Any]:
        """A bridge config (as a mapping) for this stack."""
        return {
            "rollout_url": self.rollout.url,
            "control_token": CONTROL_TOKEN,
            "tasks": str(self.tasks),
            "harness": HARNESS,
            "session_timeout_s": 120,
            "wait_timeout_s": 600,
            **fields,
        }

    def bridge_config(self, **fields: Any) -> BridgeConfig:
        return BridgeConfig.model_validate(self.config(**fields))

    def records(self, session_id: str) -> list[CompletionRecord]:
        db = Path(self.rollout.node_config.gateway.store.path)
        return SqliteStore(db).records(session_id)

    def session_rewards(self, task_ids: Iterable[str]) -> dict[str, float | None]:
        """Polar's score of each session of the given tasks, from the rollout server."""
        out: dict[str, float | None] = {}
        with RolloutClient(self.rollout.url, token=CONTROL_TOKEN) as client:
            for task_id in set(task_ids):
                result = client.result(task_id)
                assert isinstance(result, TaskResult), f"task {task_id} has not finished"
                out.update({r.session_id: r.reward for r in result.results})
        return out

    def close(self) -> None:
        self.rollout.close()
        self.engine.stop()
        self.runner.close()


def start_bridge_stack(root: Path) -> BridgeStack:
    root.mkdir(parents=True, exist_ok=True)
    model_dir = build_tiny_model(root / "tiny-qwen3")
    runner = ModelRunner(model_dir, max_batch=4)
    engine = ServerThread(create_engine_app(runner, served_name="tiny")).start()
    try:
        rollout = RolloutStack(
            root / "rollout",
            None,
            None,
            engine={"kind": "embedded", "base_url": engine.url, "model": "tiny"},
        )
    except BaseException:
        engine.stop()
        runner.close()
        raise
    return BridgeStack(root, model_dir, runner, engine, rollout, write_tasks(root))


def bridge_stack(root: Path) -> Iterator[BridgeStack]:
    stack = start_bridge_stack(root)
    try:
        yield stack
    finally:
        stack.close()


@dataclass(frozen=True)
class Expected:
    """One session's trainer sequence, rebuilt from its records."""

    prompt_ids: list[int]
    completion_ids: list[int]
    mask: list[int]
    logprobs: list[float | None]
    policy_versions: list[int]


def expected_from_records(records: list[CompletionRecord]) -> Expected:
    """The session's calls must form one chain (each prompt extends the previous
    call's prompt and output); fails loudly otherwise."""
    calls = [r for r in records if r.status is RecordStatus.COMPLETED]
    assert calls, "the session has no completed call"
    last = calls[-1]
    full = list(last.prompt_ids) + list(last.output_ids)
    start = len(calls[0].prompt_ids)
    mask = [0] * (len(full) - start)
    logprobs: list[float | None] = [None] * (len(full) - start)
    for call in calls:
        seen = list(call.prompt_ids) + list(call.output_ids)
        assert full[: len(seen)] == seen, f"{call.key} is not on the session's one chain"
        for i, logprob in enumerate(call.output_logprobs):
            mask[len(call.prompt_ids) - start + i] = 1
            logprobs[len(call.prompt_ids) - start + i] = logprob
    return Expected(full[:start], full[start:], mask, logprobs, [c.policy_version for c in calls])


# ---------------------------------------------------------------- a sampled token without a logprob

PROMPT = (1, 2, 3)
FIRST_CALL = (10, 11)
"""Sampled by the first call; the engine reported no logprob for 11."""
BETWEEN = (50,)
"""The environment's token before the second call."""
SECOND_CALL = (12, 13)
LOGPROBS = {10: -0.5, 12: -1.0, 13: -2.0}


def session_missing_a_logprob(session_id: str = "s-missing") -> SessionResult:
    """A scored session whose one trace (two calls) has a sampled token, 11,
    without a recorded logprob (``logprob_mask`` 0, loss mask 1), as the node
    exports it when an engine omits a logprob or reports a non-finite one."""
    response = (*FIRST_CALL, *BETWEEN, *SECOND_CALL)
    trace = PolarSample(
        trace_id=f"{session_id}/0.0",
        session_id=session_id,
        group_id="g",
        builder="prefix_merge",
        chain=0,
        segment=0,
        chain_class=ChainClass.MAIN,
        break_reason=None,
        trainable=True,
        policy_version=3,
        prompt_ids=PROMPT,
        response_ids=response,
        loss_mask=(1, 1, 0, 1, 1),
        rollout_logprobs=tuple(LOGPROBS.get(t, 0.0) for t in response),
        logprob_mask=tuple(int(t in LOGPROBS) for t in response),
        reward=1.0,
        reward_scale=1.0,
        finish_reason=None,
        source_records=("r1", "r2"),
        turn_offsets=(TurnSpan("r1", 0, 0, 2), TurnSpan("r2", 2, 3, 5)),
        truncated_turns=0,
        malformed_tool_calls=0,
        sampling=MODEL,
    )
    return SessionResult(
        session_id=session_id,
        task_id="t",
        sample_index=0,
        status=SessionStatus.COMPLETED,
        reward=1.0,
        samples=[json.loads(json.dumps(row_of(trace)))],
    )
