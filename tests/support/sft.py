"""A prefix-merged trace and its conversation, built from named pieces with the
real Qwen3 tokenizer, for the SFT export and training tests."""

from __future__ import annotations

from typing import Any

from polar.sft.verdict import AttemptKey

KEY = AttemptKey("fix-median", 2)
USER = "<|im_start|>user\nFix the median.<|im_end|>\n<|im_start|>assistant\n"
FIRST = (
    "<think>\nLook.\n</think>\n\n"
    '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>'
)
TOOL = (
    "\n<|im_start|>user\n<tool_response>\nsummary.py\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n"
)
SECOND = "<think>\nDone.\n</think>\n\nFixed.<|im_end|>"


def sample(tokenizer: Any) -> dict[str, Any]:
    """A prefix-merged trace: prompt, sampled turn, tool output, sampled turn."""

    def ids(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    first, tool, second = ids(FIRST), ids(TOOL), ids(SECOND)
    return {
        "trace_id": "sft.fix-median.a2-s0/0.0",
        "chain_class": "main",
        "reward": 1.0,
        "prompt_ids": ids(USER),
        "response_ids": first + tool + second,
        "loss_mask": [1] * len(first) + [0] * len(tool) + [1] * len(second),
    }


CONVERSATION = {
    "trace_id": "sft.fix-median.a2-s0/0.0",
    "problem": None,
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "bash",
                "description": "Run a command.",
                "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
            },
        }
    ],
    "messages": [
        {"role": "user", "content": "Fix the median."},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Look.",
            "tool_calls": [
                {
                    "id": "call_9f3a",
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"command": "ls"}'},
                }
            ],
        },
        {"role": "tool", "content": "summary.py", "tool_call_id": "call_9f3a"},
        {"role": "assistant", "content": "Fixed.", "reasoning_content": "Done."},
    ],
}


# ---------------------------------------------------------------- generation runs

TOOL_AGENT = """
import json, os, subprocess, sys, urllib.request

BASH = {"type": "function", "function": {"name": "bash", "description": "Run a command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}

def call(messages, tools):
    body = {"model": os.environ["OPENAI_MODEL"], "messages": messages}
    if tools:
        body["tools"] = tools
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                 "content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as reply:
        return json.load(reply)["choices"][0]["message"]

task = sys.argv[1]
call([{"role": "user", "content": "Write a title for: " + task[:60]}], None)
messages = [{"role": "system", "content": "You fix code with the bash tool."},
            {"role": "user", "content": task}]
for _ in range(6):
    reply = call(messages, [BASH])
    calls = reply.get("tool_calls") or []
    messages.append({"role": "assistant", "content": reply.get("content"), "tool_calls": calls})
    if not calls:
        break
    for c in calls:
        command = json.loads(c["function"]["arguments"])["command"]
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
        output = (done.stdout + done.stderr)[-2000:] + "exit " + str(done.returncode)
        messages.append({"role": "tool", "tool_call_id": c["id"], "content": output})
"""
"""A minimal tool-calling agent (stand-in for an agent CLI, which is slow to start
here): a title side call, then the chat loop with one ``bash`` tool."""


def tool_agent_command() -> str:
    """The ``shell`` harness's ``command`` option that runs :data:`TOOL_AGENT`."""
    assert "'" not in TOOL_AGENT
    return f"python3 -c '{TOOL_AGENT}' {{instruction}}"


def attempt_scripts(plan: dict[str, list[bool]]) -> dict[str, Any]:
    """Per-session scripts for a generation on the private local service: attempt
    ``k`` of ``task`` (session ``sft.<task>.a<k>-s0``) applies the task's
    solution where ``plan[task][k]``, its wrong patch elsewhere."""
    import re

    from polar.tasks.builtin import solution_patch, wrong_patch

    from support.rollout import patch_command

    sessions = []
    for task, right in plan.items():
        for k, ok in enumerate(right):
            patch = solution_patch(task) if ok else wrong_patch(task)
            sessions.append(
                {
                    "session": re.escape(f"sft.{task}.a{k}-s0") + "$",
                    "side": [{"when": {"prompt_contains": "Write a title"}, "text": "A fix"}],
                    "turns": [
                        {
                            "reasoning": "Apply the fix.",
                            "tool_calls": [
                                {"name": "bash", "arguments": {"command": patch_command(patch)}}
                            ],
                        },
                        {"reasoning": "Applied.", "text": "Done."},
                    ],
                }
            )
    return {"sessions": sessions}
