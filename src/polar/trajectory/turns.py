"""The few facts about the chat template a builder needs, as token ids.

Builders never guess these from the records (the published Polar took the last
token of the first naturally stopped turn as end-of-turn, which fails on a chain
that never stopped naturally). They come from the tokenizer and its chat
template, given by the caller; :meth:`TurnFormat.from_tokenizer` reads them.

* ``end_of_turn_id`` ends every turn (``<|im_end|>`` for ChatML). A prompt's
  first turn (system prompt and tool definitions, for most templates) runs up
  to the first one: two calls with the same first turn were sent with the same
  system prompt and tools. A sampled turn that does not end with it was cut
  short, and the template closes it in the next prompt.
* ``generation_prompts`` are what the template appends to open the model's turn
  (``<|im_start|>assistant\\n<think>\\n`` for Qwen3). A prompt that continues
  an earlier prompt *minus* its generation prompt either re-rendered that
  call's reply from a different opening (it keeps ``assistant_header``) or
  dropped it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from polar.ir import JsonObject
from polar.tokenizer import Tokenizer
from polar.trajectory.errors import BuildInputError

_PROBE = "polar probe"


@dataclass(frozen=True, slots=True)
class TurnFormat:
    end_of_turn_id: int
    generation_prompts: tuple[tuple[int, ...], ...] = ()
    assistant_header: tuple[int, ...] = ()
    """The part of the generation prompt an answered turn in history also starts
    with (``<|im_start|>assistant\\n`` for Qwen3, whose generation prompt adds
    ``<think>\\n``): a prompt that keeps it re-rendered that turn, one that does
    not dropped it."""

    @classmethod
    def from_tokenizer(
        cls,
        tokenizer: Tokenizer,
        *,
        end_of_turn: str | None = None,
        template_kwargs: JsonObject | None = None,
    ) -> TurnFormat:
        """Read the format from a Hugging Face tokenizer with a chat template.

        ``end_of_turn`` defaults to the tokenizer's eos token (what the gateway's
        renderer uses); the generation prompt is what the template adds to a
        one-message conversation when asked for one.
        """
        eot = end_of_turn or getattr(tokenizer, "eos_token", None)
        if not eot:
            raise BuildInputError("the tokenizer has no eos token; give the end of turn explicitly")
        ids = list(tokenizer.encode(str(eot), add_special_tokens=False))
        if len(ids) != 1:
            raise BuildInputError(f"end of turn {eot!r} is not a single token: {ids}")
        kwargs = dict(template_kwargs or {})

        def render(conversation: list[dict[str, str]], opened: bool) -> str:
            return str(
                tokenizer.apply_chat_template(
                    conversation, tokenize=False, add_generation_prompt=opened, **kwargs
                )
            )

        question = {"role": "user", "content": _PROBE}
        try:
            closed = render([question], False)
            opened = render([question], True)
            # An answered turn that is not the last one (templates often render
            # the last assistant turn specially, e.g. with an empty think block).
            answered = render([question, {"role": "assistant", "content": _PROBE}, question], False)
        except Exception as exc:
            raise BuildInputError(
                f"the tokenizer's chat template cannot be applied: {exc}"
            ) from exc
        prompts: tuple[tuple[int, ...], ...] = ()
        header: tuple[int, ...] = ()
        if opened.startswith(closed) and len(opened) > len(closed):
            opener = tuple(tokenizer.encode(opened[len(closed) :], add_special_tokens=False))
            prompts = (opener,)
            if answered.startswith(closed):
                turn = tokenizer.encode(answered[len(closed) :], add_special_tokens=False)
                n = 0
                while n < min(len(opener), len(turn)) and opener[n] == turn[n]:
                    n += 1
                header = opener[:n]
        return cls(end_of_turn_id=ids[0], generation_prompts=prompts, assistant_header=header)

    def head_length(self, prompt: Sequence[int]) -> int:
        """Length of the prompt's first turn, its end-of-turn token included."""
        try:
            return prompt.index(self.end_of_turn_id) + 1
        except ValueError:
            return len(prompt)

    def without_generation_prompt(self, prompt: Sequence[int]) -> int | None:
        """Length of ``prompt`` before a trailing generation prompt (``None``: none there)."""
        best: int | None = None
        for opener in self.generation_prompts:
            n = len(opener)
            if n and len(prompt) >= n and tuple(prompt[-n:]) == opener:
                cut = len(prompt) - n
                best = cut if best is None else min(best, cut)
        return best
