"""Cost of building each prompt of a long session: splice vs re-tokenizing everything.

    .venv/bin/python benchmarks/render.py [--turns 128] [--tool-output-chars 2400]

A synthetic coding session with the real Qwen3 tokenizer and chat template:
a system prompt, 12 tools, then turns of (assistant reasoning + a tool call,
tool output), growing to about 100k tokens. For every call the gateway must
build the prompt; measured side by side, in one run:

* **splice** (token-in/token-out mode): find the earlier call this one
  extends, take its prompt + sampled ids, render only the new messages;
* **re-tokenize**: render the whole conversation with the chat template and
  tokenize it (what a gateway without splicing does on every call).

It prints per-call times at a few points of the session and the ratio of the
totals. The splice result is checked to extend the previous prompt.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from polar.ir import Message, Role, TextPart, ToolCall, ToolSpec
from polar.proxy.render.splice import PastCall, Transcript, plan_prompt
from polar.proxy.render.template import ChatTemplate

TOOLS = tuple(
    ToolSpec(
        name=name,
        description=f"{name.replace('_', ' ').capitalize()}. " + "Detailed usage notes. " * 30,
        parameters={
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "What to run. " * 5},
                "path": {"type": "string", "description": "A path in the workspace."},
                "timeout": {"type": "integer", "description": "Seconds."},
            },
            "required": ["command"],
        },
    )
    for name in (
        "run_shell_command", "read_file", "write_file", "edit", "glob", "grep_search",
        "list_directory", "todo_write", "web_fetch", "task", "skill", "monitor",
    )
)  # fmt: skip
SYSTEM = "You are a coding agent working in a repository. " * 120


def session(turns: int, output_chars: int) -> list[tuple[list[Message], str]]:
    """Each call's messages, and what the model samples for it."""
    messages = [
        Message(role=Role.SYSTEM, parts=(TextPart(SYSTEM),)),
        Message(role=Role.USER, parts=(TextPart("Fix the failing test in tests/test_api.py."),)),
    ]
    calls = []
    line = "src/module_{i}.py:{j}: def function_{j}(arg): return arg * {i}  # code line\n"
    for k in range(turns):
        arguments = json.dumps({"command": f"grep -rn 'function_{k}' src/ | head -50"})
        sampled = (
            f"Step {k}: look for function_{k} in the sources.\n</think>\n\n"
            f'<tool_call>\n{{"name": "run_shell_command", "arguments": {arguments}}}\n</tool_call>'
            "<|im_end|>"
        )
        calls.append((list(messages), sampled))
        call_id = f"call_{k}"
        messages.append(
            Message(
                role=Role.ASSISTANT,
                parts=(ToolCall(id=call_id, name="run_shell_command", arguments=arguments),),
            )
        )
        text = "".join(line.format(i=k, j=j) for j in range(200))[:output_chars]
        messages.append(Message(role=Role.TOOL, parts=(TextPart(text),), tool_call_id=call_id))
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=128)
    parser.add_argument("--tool-output-chars", type=int, default=2400)
    args = parser.parse_args()

    from polar.tokenizer import load_tokenizer

    template = ChatTemplate(load_tokenizer())
    calls = session(args.turns, args.tool_output_chars)
    transcript = Transcript()
    splice_s: list[float] = []
    full_s: list[float] = []
    sizes: list[int] = []
    previous: tuple[int, ...] = ()
    for k, (messages, sampled) in enumerate(calls):
        start = time.perf_counter()
        plan = plan_prompt(template, messages, TOOLS, transcript, kwargs={})
        splice_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        ids, _ = template.render(messages, TOOLS, kwargs={})
        full_s.append(time.perf_counter() - start)
        if k:
            assert plan.ids[: len(previous)] == previous, "splice must extend the previous prompt"
        output = tuple(template.text.encode(sampled))
        # What the gateway returned for this call is the assistant turn the
        # harness sends back in the next one.
        returned = calls[k + 1][0][-2] if k + 1 < len(calls) else messages[-1]
        base = transcript.calls[-1] if transcript.calls else None
        transcript.add(PastCall.of(k + 1, 1, tuple(messages), plan.ids, output, returned, on=base))
        previous = plan.ids + output
        sizes.append(len(plan.ids))

    print(f"{args.turns} calls, final prompt {sizes[-1]:,} tokens (re-tokenized: {len(ids):,})")
    print(f"{'call':>6}{'prompt tokens':>15}{'splice':>11}{'re-tokenize':>14}{'ratio':>8}")
    for k in sorted({0, 1, len(calls) // 4, len(calls) // 2, len(calls) - 1}):
        print(
            f"{k + 1:>6}{sizes[k]:>15,}{splice_s[k] * 1000:>9.2f}ms"
            f"{full_s[k] * 1000:>12.2f}ms{full_s[k] / splice_s[k]:>7.1f}x"
        )
    later = slice(1, None)  # the first call has nothing to splice
    median_splice = statistics.median(splice_s[later]) * 1000
    median_full = statistics.median(full_s[later]) * 1000
    print(
        f"\nper call after the first: splice median {median_splice:.2f} ms, "
        f"re-tokenize median {median_full:.2f} ms ({median_full / median_splice:.1f}x)"
    )
    print(
        f"whole session: splice {sum(splice_s):.3f} s, re-tokenize {sum(full_s):.3f} s, "
        f"{sum(full_s) / sum(splice_s):.1f}x cheaper; "
        f"last call {full_s[-1] / splice_s[-1]:.1f}x cheaper"
    )


if __name__ == "__main__":
    main()
