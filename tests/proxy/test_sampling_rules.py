"""What each call is sampled with: a session's policy enforced, the harness's
settings otherwise with every unset one sent explicitly, and the record's
behaviour saying so (:mod:`polar.proxy.call.behaviour`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from polar.ir import (
    ChatRequest,
    Distribution,
    EditKind,
    LogprobSource,
    Message,
    Role,
    Sampling,
    TextPart,
    ToolChoice,
    ToolChoiceMode,
    ToolSpec,
    Unreproducible,
    distribution_of,
)
from polar.proxy.call.behaviour import SamplingRules, behaviour_of, defaults_over
from polar.proxy.engines.defaults import NEUTRAL, model_defaults

USER = [{"role": "user", "content": "hi"}]
HARNESS = Sampling(
    max_tokens=50,
    temperature=0.6,
    top_p=0.95,
    presence_penalty=1.5,
    seed=42,
    stop=("END",),
    logit_bias={7: -100.0},
)


def request(sampling: Sampling = HARNESS, **fields: Any) -> ChatRequest:
    return ChatRequest(
        model="m",
        messages=(Message(role=Role.USER, parts=(TextPart("hi"),)),),
        sampling=sampling,
        **fields,
    )


def test_a_policy_replaces_what_the_harness_asked_and_says_what_that_was() -> None:
    rules = SamplingRules()
    out = rules.apply(request(), Distribution(temperature=1.0, top_k=40))

    s = out.sampling
    assert (s.temperature, s.top_p, s.top_k, s.min_p) == (1.0, 1.0, 40, 0.0)
    assert (s.presence_penalty, s.frequency_penalty, s.repetition_penalty) == (0.0, 0.0, 1.0)
    assert s.seed is None and not s.logit_bias, "a fixed seed would make a group sample alike"
    assert (s.max_tokens, s.stop) == (50, ("END",)), "the output limit and stops are the harness's"
    (edit,) = out.edits
    assert edit.kind is EditKind.ENFORCED_SAMPLING
    assert edit.detail == (
        "sent temperature 1, top_k 40 (the session's sampling policy); the harness asked "
        "temperature 0.6, top_p 0.95, presence_penalty 1.5, seed 42, logit_bias on 1 token(s)"
    )
    behaviour = behaviour_of(out, LogprobSource.PROCESSED, guided=False)
    assert behaviour.enforced and distribution_of(behaviour) == Distribution(top_k=40)


def test_the_gateways_policy_applies_to_sessions_without_their_own() -> None:
    rules = SamplingRules(policy=Distribution(temperature=0.8))
    assert rules.apply(request(), None).sampling.temperature == 0.8
    assert rules.apply(request(), Distribution(temperature=0.3)).sampling.temperature == 0.3


def test_without_a_policy_unset_settings_are_sent_as_the_models_defaults() -> None:
    defaults = defaults_over(Sampling(min_p=0.05), Sampling(temperature=0.7, top_k=20))
    assert defaults == Sampling(
        temperature=0.7,
        top_p=1.0,
        top_k=20,
        min_p=0.05,
        presence_penalty=0.0,
        frequency_penalty=0.0,
        repetition_penalty=1.0,
    )
    out = SamplingRules(defaults=defaults).apply(request(Sampling(top_p=0.9)), None)
    assert out.sampling == Sampling(
        temperature=0.7,
        top_p=0.9,
        top_k=20,
        min_p=0.05,
        presence_penalty=0.0,
        frequency_penalty=0.0,
        repetition_penalty=1.0,
    )
    assert out.edits == ()


def test_a_models_generation_config_is_read_as_vllm_reads_it(tmp_path: Path) -> None:
    from transformers import GenerationConfig

    assert model_defaults(None) == NEUTRAL == model_defaults(tmp_path)
    GenerationConfig(
        do_sample=True, temperature=0.6, top_p=0.95, top_k=50, repetition_penalty=1.05
    ).save_pretrained(str(tmp_path))
    read = model_defaults(tmp_path)
    assert (read.temperature, read.top_p, read.top_k, read.repetition_penalty) == (
        0.6,
        0.95,
        50,
        1.05,
    )
    assert (read.min_p, read.presence_penalty) == (0.0, 0.0), "what the file leaves out: neutral"


def test_guided_decoding_makes_a_call_unreproducible() -> None:
    bash = ToolSpec(name="bash", parameters={"type": "object"})
    explicit = SamplingRules().apply(request(Sampling()), None)
    forced = request(
        explicit.sampling, tools=(bash,), tool_choice=ToolChoice(ToolChoiceMode.REQUIRED)
    )
    json_mode = request(explicit.sampling, response_format={"type": "json_object"})
    for constrained in (forced, json_mode):
        engine_side = behaviour_of(constrained, LogprobSource.PROCESSED, guided=True)
        assert distribution_of(engine_side) is Unreproducible.CONSTRAINED
        # Token routes take no constraint: the same request samples freely there.
        token_side = behaviour_of(constrained, LogprobSource.PROCESSED, guided=False)
        assert distribution_of(token_side) == Distribution()


def test_sessions_carry_their_policy_through_the_admin_api_and_a_restart(make_stack: Any) -> None:
    stack = make_stack({"turns": [{"text": "a"}, {"text": "b"}]}, engine={"logprobs": "processed"})
    with stack.admin() as admin:
        bad = admin.post("/admin/sessions", json={"sampling": {"top_p": 2}})
        assert bad.status_code == 400 and "sampling.top_p" in bad.json()["error"]["message"]
        assert admin.post("/admin/sessions", json={"sampling": {"seed": 1}}).status_code == 400
        created = admin.post("/admin/sessions", json={"sampling": {"temperature": 0.5}})
        assert created.status_code == 201
        sid, key = created.json()["session_id"], created.json()["api_key"]
        assert created.json()["sampling"] == {
            "temperature": 0.5,
            "top_p": 1.0,
            "top_k": 0,
            "min_p": 0.0,
        }
        assert admin.get(f"/admin/sessions/{sid}").json()["sampling"]["temperature"] == 0.5
    stack.openai(key).chat.completions.create(model="m", messages=USER, temperature=1.3)
    stack.stop_gateway()
    stack.start_gateway()
    stack.openai(key).chat.completions.create(model="m", messages=USER, temperature=1.3)
    first, second = stack.records(sid)
    for record in (first, second):
        assert record.engine_request["temperature"] == 0.5
        assert record.behaviour is not None and record.behaviour.logprobs is LogprobSource.PROCESSED
        assert distribution_of(record.behaviour) == Distribution(temperature=0.5)


def test_a_vllm_engine_reports_raw_logprobs_unless_configured(make_stack: Any) -> None:
    stack = make_stack({"turns": [{"text": "a"}]})
    sid, key = stack.new_session()
    stack.openai(key).chat.completions.create(model="m", messages=USER)
    (record,) = stack.records(sid)
    assert record.behaviour is not None and record.behaviour.logprobs is LogprobSource.RAW
    # The bundled tokenizer has no generation config: the neutral settings, sent explicitly.
    assert {k: record.engine_request[k] for k in ("temperature", "top_p", "top_k", "min_p")} == {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
    }
    assert distribution_of(record.behaviour) == Distribution()


def test_sglangs_logprobs_are_temperature_scaled(make_stack: Any) -> None:
    """SGLang reports ``log(softmax(logits / T))``, before top-k and top-p (its
    sampler, read in its source; SGLang itself is CUDA-only, the scripted engine
    speaks its wire format): right for an uncut policy, not for a nucleus."""
    for capture in ("engine_rendered", "token_in_token_out"):
        stack = make_stack(
            {"turns": [{"text": "a"}, {"text": "b"}]}, wire="sglang", capture=capture
        )
        with stack.admin() as admin:
            sessions = [
                admin.post("/admin/sessions", json={"sampling": policy}).json()
                for policy in ({"temperature": 0.7}, {"temperature": 0.7, "top_p": 0.9})
            ]
        for session in sessions:
            stack.openai(session["api_key"]).chat.completions.create(model="m", messages=USER)
        (uncut,), (nucleus,) = (stack.records(s["session_id"]) for s in sessions)
        assert uncut.behaviour is not None and uncut.behaviour.logprobs is LogprobSource.SCALED
        assert distribution_of(uncut.behaviour) == Distribution(temperature=0.7)
        assert distribution_of(nucleus.behaviour) is Unreproducible.LOGPROBS
        sent = (
            uncut.engine_request["sampling_params"]
            if capture == "token_in_token_out"
            else uncut.engine_request
        )
        assert (sent["temperature"], sent["top_k"]) == (0.7, -1)
