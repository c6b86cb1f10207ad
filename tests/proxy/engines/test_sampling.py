"""Sampling settings reach each engine route under that route's own wire names
(vLLM's and SGLang's OpenAI routes: ``max_tokens``/``seed``; SGLang's native
``/generate``: ``sampling_params`` with ``max_new_tokens``/``sampling_seed``)."""

from __future__ import annotations

from polar.ir import ChatRequest, Message, Role, Sampling, TextPart
from polar.proxy.engines.base import TokenRequest
from polar.proxy.engines.openai_compat import chat_body
from polar.proxy.engines.sglang_tokens import generate_body
from polar.proxy.engines.vllm_tokens import completion_body

EVERY_SETTING = Sampling(
    max_tokens=64,
    temperature=0.7,
    top_p=0.9,
    top_k=20,
    min_p=0.05,
    presence_penalty=0.1,
    frequency_penalty=0.2,
    repetition_penalty=1.1,
    seed=7,
    stop=("END",),
    logit_bias={151645: -100.0},
)
COMMON = {
    "temperature": 0.7,
    "top_p": 0.9,
    "top_k": 20,
    "min_p": 0.05,
    "presence_penalty": 0.1,
    "frequency_penalty": 0.2,
    "repetition_penalty": 1.1,
    "stop": ["END"],
    "logit_bias": {"151645": -100.0},
}
OPENAI_WIRE = {"max_tokens": 64, "seed": 7, **COMMON}


def chat(sampling: Sampling) -> ChatRequest:
    return ChatRequest(
        model="policy",
        messages=(Message(role=Role.USER, parts=(TextPart("hi"),)),),
        sampling=sampling,
    )


def tokens(sampling: Sampling) -> TokenRequest:
    return TokenRequest(prompt_ids=(1, 2, 3), sampling=sampling, stream=False)


def picked(body: dict[str, object], names: dict[str, object]) -> dict[str, object]:
    return {key: body[key] for key in body if key in names}


def test_the_chat_route_takes_the_openai_names() -> None:
    body = chat_body(
        chat(EVERY_SETTING), model="m", reasoning_field="reasoning", template_kwargs={}
    )

    assert picked(body, OPENAI_WIRE) == OPENAI_WIRE


def test_vllms_completions_route_takes_the_openai_names() -> None:
    body = completion_body(tokens(EVERY_SETTING), model="m")

    assert picked(body, OPENAI_WIRE) == OPENAI_WIRE


def test_sglangs_generate_route_takes_its_own_names_in_sampling_params() -> None:
    body = generate_body(tokens(EVERY_SETTING))

    assert body["sampling_params"] == {
        "skip_special_tokens": False,
        "no_stop_trim": True,
        "max_new_tokens": 64,
        "sampling_seed": 7,
        **COMMON,
    }
    assert "max_tokens" not in body and "temperature" not in body


def test_settings_left_unset_are_not_sent() -> None:
    chat_wire = chat_body(
        chat(Sampling()), model="m", reasoning_field="reasoning", template_kwargs={}
    )
    vllm_wire = completion_body(tokens(Sampling()), model="m")
    sglang_wire = generate_body(tokens(Sampling()))

    assert not set(chat_wire) & set(OPENAI_WIRE)
    assert not set(vllm_wire) & set(OPENAI_WIRE)
    assert sglang_wire["sampling_params"] == {"skip_special_tokens": False, "no_stop_trim": True}


def test_no_top_k_limit_goes_out_as_minus_one_on_every_route() -> None:
    """0 is "no limit" in the IR; SGLang refuses 0, and both engines read -1 as disabled."""
    unlimited = Sampling(top_k=0)

    assert (
        chat_body(chat(unlimited), model="m", reasoning_field="reasoning", template_kwargs={})[
            "top_k"
        ]
        == -1
    )
    assert completion_body(tokens(unlimited), model="m")["top_k"] == -1
    assert generate_body(tokens(unlimited))["sampling_params"]["top_k"] == -1
