"""Trajectory builders on synthetic sessions of 8, 32 and 128 turns.

    .venv/bin/python benchmarks/builders.py [--turns 8,32,128] [--repeat 5]

Each session is a coding agent's conversation with the real Qwen3 tokenizer and
chat template: a long system prompt, 12 tools, a title side call, then turns of
(reasoning + a tool call, ~560 tokens of tool output), about 100k tokens at 128
turns. Records are made as the gateway makes them, in both capture modes:
token-in/token-out (the gateway's own splice planner: every prompt extends the
last) and engine-rendered (the template re-renders the whole conversation, and
drops each earlier turn's reasoning, as Qwen3's does).

Measured in one run, side by side:

(a) build time of ``prefix_merge`` and ``per_request`` (best of ``--repeat``)
    against re-tokenizing the whole final conversation with the chat template
    once (a lower bound for any builder that re-tokenizes instead of reusing
    the recorded ids);
(b) what a trainer processes per session: samples and tokens (prompt + response
    of trainable traces), ``per_request`` against ``prefix_merge``;
(c) scaling: build time per 1k tokens of input (every record's prompt and
    output, which is what a builder must read) across session lengths.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from polar.ir import (
    CaptureMode,
    CompletionRecord,
    Dialect,
    FinishReason,
    Message,
    RecordStatus,
    Role,
    TextPart,
    Timings,
    ToolCall,
    ToolSpec,
)
from polar.proxy.render.splice import PastCall, Transcript, lineage_of, plan_prompt
from polar.proxy.render.template import ChatTemplate, template_message, template_tools
from polar.trajectory import BuildConfig, PerRequest, PrefixMerge, Trajectory, TurnFormat

TOOLS = tuple(
    ToolSpec(
        name=name,
        description=f"{name.replace('_', ' ').capitalize()}. " + "Detailed usage notes. " * 30,
        parameters={
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "What to run. " * 5},
                "path": {"type": "string", "description": "A path in the workspace."},
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
TASK = "Fix the failing test in tests/test_api.py."
LINE = "src/module_{i}.py:{j}: def function_{j}(arg): return arg * {i}  # code line\n"


@dataclass
class Built:
    records: list[CompletionRecord]
    final_messages: list[Message]


def play(template: ChatTemplate, capture: CaptureMode, turns: int) -> Built:
    """A session's records, as the gateway records them in ``capture`` mode."""
    transcript = Transcript()
    records: list[CompletionRecord] = []

    def record(seq: int, messages: list[Message], tools: tuple[ToolSpec, ...], sampled: str,
               returned: Message) -> None:  # fmt: skip
        if capture is CaptureMode.TOKEN_IN_TOKEN_OUT:
            plan = plan_prompt(template, messages, tools, transcript, kwargs={})
            prompt, lineage = plan.ids, plan.lineage
        else:
            ids, _ = template.render(messages, tools, kwargs={})
            prompt, lineage = tuple(ids), lineage_of(ids, messages, transcript)
        output = tuple(template.text.encode(sampled))
        base = transcript.calls[-1] if transcript.calls else None
        transcript.add(PastCall.of(seq, 1, tuple(messages), prompt, output, returned, on=base))
        records.append(
            CompletionRecord(
                session_id="ses_bench", seq=seq, attempt=1, status=RecordStatus.COMPLETED,
                dialect=Dialect.OPENAI_CHAT, capture=capture, engine="bench", model="bench",
                policy_version=0, stream=True, original_request={}, engine_request={},
                timings=Timings(arrived=float(seq)), prompt_ids=prompt, output_ids=output,
                output_logprobs=tuple(-0.01 * (i % 97) - 0.001 for i in range(len(output))),
                finish_reason=FinishReason.TOOL_CALLS if returned.tool_calls else FinishReason.STOP,
                message=returned, lineage=lineage,
            )
        )  # fmt: skip

    title = [
        Message(role=Role.SYSTEM, parts=(TextPart("Write a five-word title for the request."),)),
        Message(role=Role.USER, parts=(TextPart(TASK),)),
    ]
    answer = Message(role=Role.ASSISTANT, parts=(TextPart("Fixing the API test"),))
    record(1, title, (), "\n</think>\n\nFixing the API test<|im_end|>", answer)
    messages = [
        Message(role=Role.SYSTEM, parts=(TextPart(SYSTEM),)),
        Message(role=Role.USER, parts=(TextPart(TASK),)),
    ]
    for k in range(turns):
        arguments = json.dumps({"command": f"grep -rn 'function_{k}' src/ | head -50"})
        sampled = (
            f"Step {k}: look for function_{k} in the sources.\n</think>\n\n"
            f'<tool_call>\n{{"name": "run_shell_command", "arguments": {arguments}}}\n</tool_call>'
            "<|im_end|>"
        )
        call = ToolCall(id=f"call_{k}", name="run_shell_command", arguments=arguments)
        returned = Message(role=Role.ASSISTANT, parts=(call,))
        record(k + 2, list(messages), TOOLS, sampled, returned)
        output = "".join(LINE.format(i=k, j=j) for j in range(200))[:1800]
        messages += [
            returned,
            Message(role=Role.TOOL, parts=(TextPart(output),), tool_call_id=call.id),
        ]
    return Built(records, messages)


def best(repeat: int, run: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def trainer_load(trajectory: Trajectory) -> tuple[int, int]:
    traces = trajectory.trainable
    return len(traces), sum(t.tokens for t in traces)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--turns", default="8,32,128")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    sizes = [int(n) for n in args.turns.split(",")]

    from polar.tokenizer import load_tokenizer

    tokenizer = load_tokenizer()
    template = ChatTemplate(tokenizer)
    config = BuildConfig(turns=TurnFormat.from_tokenizer(tokenizer))
    merge, single = PrefixMerge(config), PerRequest(config)

    timing_rows, load_rows, scaling = [], [], []
    for capture in CaptureMode:
        for turns in sizes:
            built = play(template, capture, turns)
            records = built.records
            final = records[-1]
            input_tokens = sum(len(r.prompt_ids) + len(r.output_ids) for r in records)
            merged, each = merge.build(records), single.build(records)
            assert merged.accounting.captured == each.accounting.captured
            t_merge = best(args.repeat, lambda r=records: merge.build(r))
            t_single = best(args.repeat, lambda r=records: single.build(r))
            converted = [template_message(m) for m in built.final_messages]
            t_render = best(
                args.repeat,
                lambda c=converted: template.text.encode(
                    template.render_text(c, template_tools(TOOLS), kwargs={},
                                         add_generation_prompt=False)
                ),
            )  # fmt: skip
            mode = "token" if capture is CaptureMode.TOKEN_IN_TOKEN_OUT else "engine"
            timing_rows.append(
                (mode, turns, len(final.prompt_ids) + len(final.output_ids), t_merge, t_single,
                 t_render)
            )  # fmt: skip
            load_rows.append((mode, turns, trainer_load(each), trainer_load(merged),
                              dict(merged.accounting.breaks)))  # fmt: skip
            scaling.append((mode, turns, input_tokens, t_merge))

    print(f"(a) build time per session (best of {args.repeat})")
    print(f"{'capture':>8}{'turns':>7}{'final tokens':>14}{'prefix_merge':>14}{'per_request':>13}"
          f"{'re-tokenize':>13}{'re-tok / merge':>16}")  # fmt: skip
    for mode, turns, final_tokens, t_merge, t_single, t_render in timing_rows:
        print(f"{mode:>8}{turns:>7}{final_tokens:>14,}{t_merge * 1e3:>12.1f}ms"
              f"{t_single * 1e3:>11.1f}ms{t_render * 1e3:>11.1f}ms"
              f"{t_render / t_merge:>15.1f}x")  # fmt: skip

    print("\n(b) what a trainer processes per session (trainable traces)")
    print(f"{'capture':>8}{'turns':>7}{'samples: per_request':>22}{'prefix_merge':>14}"
          f"{'tokens: per_request':>21}{'prefix_merge':>14}{'ratio':>8}  breaks")  # fmt: skip
    for mode, turns, (n_each, tok_each), (n_merged, tok_merged), breaks in load_rows:
        reasons = ", ".join(f"{k.value} {v}" for k, v in breaks.items()) or "none"
        print(f"{mode:>8}{turns:>7}{n_each:>22,}{n_merged:>14,}{tok_each:>21,}{tok_merged:>14,}"
              f"{tok_each / tok_merged:>7.2f}x  {reasons}")  # fmt: skip

    print("\n(c) scaling of prefix_merge build time with session length")
    print(f"{'capture':>8}{'turns':>7}{'input tokens':>14}{'build':>11}{'per input token':>18}")
    for mode, turns, input_tokens, t_merge in scaling:
        print(f"{mode:>8}{turns:>7}{input_tokens:>14,}{t_merge * 1e3:>9.1f}ms"
              f"{t_merge * 1e9 / input_tokens:>16.1f}ns")  # fmt: skip
    for mode in ("token", "engine"):
        rows = [r for r in scaling if r[0] == mode]
        if len(rows) >= 2:
            (_, t0, i0, s0), (_, t1, i1, s1) = rows[0], rows[-1]
            print(f"{mode}: {t0} -> {t1} turns: input x{i1 / i0:.1f}, build time x{s1 / s0:.1f}")


if __name__ == "__main__":
    main()
