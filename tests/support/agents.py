"""Tiny stand-in agents for lifecycle tests, run by the ``shell`` harness inside
the session's sandbox, and evaluator plug-ins that misbehave on purpose.

The agent is a real process tree talking to the real gateway over the
sandbox's relay; only its decisions are canned.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from polar.reward.base import EvalContext, EvalResult
from polar.tasks.model import DirectoryWorkspace, EvaluatorSpec, Task

AGENT = r"""
import json, os, subprocess, sys, time, urllib.request

def chat(text):
    body = {"model": os.environ["OPENAI_MODEL"], "messages": [{"role": "user", "content": text}]}
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                 "content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.load(reply)

def call(body):
    body = {"model": os.environ["OPENAI_MODEL"], **body}
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                 "content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.load(reply)["choices"][0]["message"]

BASH = {"type": "function", "function": {"name": "bash", "description": "Run a command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}

mode = sys.argv[1]
if mode == "converse":
    # A title side call, then a tool round trip. The reply is replayed the way
    # Qwen Code does it: reasoning dropped, arguments re-serialized.
    call({"messages": [{"role": "user", "content": "Write a title for: fix the bug"}]})
    messages = [{"role": "system", "content": "You fix bugs."},
                {"role": "user", "content": "Fix the bug."}]
    first = call({"messages": messages, "tools": [BASH]})
    tool_call = first["tool_calls"][0]
    arguments = json.dumps(json.loads(tool_call["function"]["arguments"]), indent=1)
    messages.append({"role": "assistant", "content": first.get("content"), "tool_calls": [
        {"id": tool_call["id"], "type": "function",
         "function": {"name": "bash", "arguments": arguments}}]})
    messages.append({"role": "tool", "tool_call_id": tool_call["id"], "content": "fixed"})
    call({"messages": messages, "tools": [BASH]})
    open("done", "w").write("1")
elif mode == "tree":
    # a child, a grandchild in its own session, and this process: all must die
    subprocess.Popen(["sleep", "7301"])
    subprocess.Popen(["sh", "-c", "sleep 7302 & wait"], start_new_session=True)
    open("started", "w").write("1")
    time.sleep(7303)
elif mode == "hang":
    chat("first call")
    open("started", "w").write("1")
    time.sleep(7304)
elif mode == "slow":
    open("started", "w").write("1")
    time.sleep(float(sys.argv[2]))
    chat("after a while")
    open("done", "w").write("1")
elif mode == "ok":
    chat("hello")
    open("done", "w").write("1")
elif mode == "fail":
    # a warning first (as Claude Code prints when its stdin is not a terminal), the
    # reason last, on the other stream
    print("Warning: Input is not a terminal", file=sys.stderr)
    print("starting", flush=True)
    print("Error: the agent gave up", flush=True)
    sys.exit(3)
elif mode == "give_up":
    # a harness that reached its own turn limit after the model answered
    chat("hello")
    print("turn limit reached", file=sys.stderr)
    sys.exit(3)
elif mode == "gated":
    # one call, then wait (at most ten minutes) for the test's go-ahead, then another
    chat("first call")
    open("started", "w").write("1")
    deadline = time.monotonic() + 600
    while not os.path.exists("go") and time.monotonic() < deadline:
        time.sleep(0.05)
    chat("second call")
    open("done", "w").write("1")
elif mode == "twice":
    chat("first call")
    chat("second call")
    open("done", "w").write("1")
"""

CONVERSE_SCRIPT = {
    "side": [{"when": {"prompt_contains": "Write a title"}, "text": "Bug fix"}],
    "turns": [
        {
            "reasoning": "Look first.",
            "tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}],
            "expect": {"prompt_contains": "Fix the bug."},
        },
        {"reasoning": "It is fixed.", "text": "Done.", "expect": {"prompt_contains": "fixed"}},
    ],
}
"""The scripted model of the ``converse`` agent."""
BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
}
"""The tool the ``converse`` agent offers."""

MARKERS = ("sleep 7301", "sleep 7302", "agent.py tree", "agent.py hang")


def agent_task(root: Path, *, evaluator: EvaluatorSpec | None = None, task_id: str = "t") -> Task:
    """A task whose workspace holds the stand-in agent; scored by ``test -f done``."""
    workspace = root / f"{task_id}-workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "agent.py").write_text(AGENT)
    return Task(
        id=task_id,
        instruction="run the stand-in agent",
        workspace=DirectoryWorkspace(path=workspace),
        evaluator=evaluator
        or EvaluatorSpec(kind="command", config={"command": "test -f done"}, timeout_s=60),
    )


def shell_harness(mode: str, *args: str) -> dict[str, Any]:
    return {"name": "shell", "options": {"command": " ".join(["python3", "agent.py", mode, *args])}}


def host_processes(needle: str) -> list[int]:
    """Host pids whose command line contains ``needle``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if needle in cmdline:
            pids.append(int(entry.name))
    return pids


class CrashingEvaluator:
    async def evaluate(self, ctx: EvalContext) -> EvalResult:
        raise RuntimeError("the evaluator fell over")


def crashing(**config: Any) -> CrashingEvaluator:
    """``support.agents:crashing``: an evaluator plug-in that raises."""
    return CrashingEvaluator()
