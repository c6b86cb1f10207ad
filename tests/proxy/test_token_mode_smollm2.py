"""Token-in/token-out capture on SmolLM2's ChatML template, end to end.

The engine is the scripted one, writing SmolLM2 tokens; the gateway renders
with the converted model's own tokenizer and template (``render.tokenizer``),
its tool format chosen by ``tool_prompt: auto`` (hermes: the template has no
tool section) and no reasoning parser (the model does not think).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from polar.ir import FinishReason, PromptOrigin
from polar.proxy.render.toolprompt import tool_section

from support.stack import BASH_TOOL, Stack

END = "<|im_end|>"
QUESTIONS = ("What is the capital of France?", "And of Italy?", "Which is larger?")
ANSWERS = ("Paris.", "Rome.", "Rome, by area and people.")


@pytest.fixture
def smollm2_stack(
    make_stack: Callable[..., Stack], smollm2_dir: Path, smollm2_tokenizer: Any
) -> Callable[[dict[str, Any]], Stack]:
    def make(script: dict[str, Any]) -> Stack:
        return make_stack(
            script,
            tokenizer=smollm2_tokenizer,
            capture="token_in_token_out",
            render={"tokenizer": str(smollm2_dir), "reasoning": False},
        )

    return make


def chatml_ids(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    return list(
        tokenizer.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=True, return_dict=False
        )
    )


def test_each_prompt_is_the_template_render_and_extends_the_last(
    smollm2_stack: Callable[[dict[str, Any]], Stack], smollm2_tokenizer: Any
) -> None:
    conversations: list[list[dict[str, Any]]] = []
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Answer in a few words."}]
    for question, answer in zip(QUESTIONS, ANSWERS, strict=True):
        messages.append({"role": "user", "content": question})
        conversations.append(list(messages))
        messages.append({"role": "assistant", "content": answer})
    turns = [
        {"raw": answer + END, "expect": {"prompt_ids": chatml_ids(smollm2_tokenizer, sent)}}
        for answer, sent in zip(ANSWERS, conversations, strict=True)
    ]
    stack = smollm2_stack({"turns": turns})
    sid, key = stack.new_session()
    client = stack.openai(key)

    for sent, answer in zip(conversations, ANSWERS, strict=True):
        reply = client.chat.completions.create(model="m", messages=sent)
        assert reply.choices[0].message.content == answer

    records = stack.records(sid)
    for earlier, later in itertools.pairwise(records):
        lineage = later.lineage
        assert lineage is not None and (lineage.origin, lineage.spliced) == (
            PromptOrigin.EXTENDS,
            True,
        )
        head = earlier.prompt_ids + earlier.output_ids
        assert later.prompt_ids[: len(head)] == head
        new = smollm2_tokenizer.decode(list(later.prompt_ids[len(head) :]))
        assert new.startswith("\n<|im_start|>user\n") and new.endswith("<|im_start|>assistant\n")
    stack.engine.assert_clean()


@pytest.mark.parametrize("stream", [True, False])
def test_a_tool_call_round_trip_in_the_hermes_format(
    smollm2_stack: Callable[[dict[str, Any]], Stack], smollm2_tokenizer: Any, stream: bool
) -> None:
    written_call = (
        '<tool_call>\n{"name": "bash", "arguments": {"command": "ls /tmp | wc -l"}}\n</tool_call>'
    )
    result_turn = "<|im_start|>tool\n<tool_response>\n3\n</tool_response><|im_end|>\n"
    stack = smollm2_stack(
        {
            "turns": [
                {
                    "raw": f"I will count them.\n{written_call}{END}",
                    "expect": {
                        "prompt_contains": '<tools>\n{"type": "function", "function": '
                        '{"name": "bash"'
                    },
                },
                {
                    "raw": f"There are 3 files.{END}",
                    "expect": {"prompt_ends_with": result_turn + "<|im_start|>assistant\n"},
                },
            ]
        }
    )
    sid, key = stack.new_session()
    client = stack.openai(key)
    user = {"role": "user", "content": "Count the files in /tmp."}

    if stream:
        content, name, arguments, call_id, finish = "", "", "", "", None
        for chunk in client.chat.completions.create(
            model="m", messages=[user], tools=[BASH_TOOL], stream=True
        ):
            for choice in chunk.choices:
                content += choice.delta.content or ""
                for delta in choice.delta.tool_calls or ():
                    call_id = delta.id or call_id
                    name += delta.function.name or ""
                    arguments += delta.function.arguments or ""
                finish = choice.finish_reason or finish
    else:
        reply = client.chat.completions.create(model="m", messages=[user], tools=[BASH_TOOL])
        message = reply.choices[0].message
        (tool_call,) = message.tool_calls or ()
        content, finish = message.content or "", reply.choices[0].finish_reason
        call_id, name, arguments = (
            tool_call.id,
            tool_call.function.name,
            tool_call.function.arguments,
        )
    assert (finish, content.strip()) == ("tool_calls", "I will count them.")
    assert (name, json.loads(arguments)) == ("bash", {"command": "ls /tmp | wc -l"})

    # The harness sends the call back re-serialized, with the tool's result.
    assistant = {
        "role": "assistant",
        "content": content.strip(),
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(json.loads(arguments))},
            }
        ],
    }
    result = {"role": "tool", "tool_call_id": call_id, "content": "3"}
    second = client.chat.completions.create(
        model="m", messages=[user, assistant, result], tools=[BASH_TOOL]
    )
    assert second.choices[0].message.content == "There are 3 files."

    first_record, second_record = stack.records(sid)
    assert first_record.finish_reason is FinishReason.TOOL_CALLS
    head = first_record.prompt_ids + first_record.output_ids
    assert second_record.prompt_ids[: len(head)] == head
    assert smollm2_tokenizer.decode(list(second_record.prompt_ids[len(head) :])) == (
        "\n" + result_turn + "<|im_start|>assistant\n"
    )
    # What the model wrote is what the hermes format writes: the spliced prompt is
    # also the fresh render of the conversation the harness sent.
    written = [
        {"role": "system", "content": tool_section([BASH_TOOL])},
        {"role": "user", "content": user["content"]},
        {"role": "assistant", "content": f"I will count them.\n{written_call}"},
        {"role": "tool", "content": "<tool_response>\n3\n</tool_response>"},
    ]
    assert list(second_record.prompt_ids) == chatml_ids(smollm2_tokenizer, written)
    stack.engine.assert_clean()
