"""What a call is sampled with: the gateway's sampling rules.

The trainer corrects against the distribution the engine drew each token
from (:mod:`polar.ir.behaviour`), so the gateway decides that distribution
itself, for every call, and records it:

* **A sampling policy** (a session's own, given when it is created, else the
  gateway's ``sampling.policy``) is enforced: the call goes to the engine with
  exactly the policy's temperature, top-p, top-k and min-p, whatever the
  harness asked; its presence, frequency and repetition penalties and logit
  bias are dropped (a trainer does not reproduce them), and so is its seed (a
  fixed seed would make every session of a GRPO group sample alike). The
  record gets an ``enforced_sampling`` edit saying what the harness had asked.
  The output limit and stop strings stay the harness's.
* **Without a policy** the harness's settings stand, and every setting it left
  unset is sent explicitly: ``sampling.defaults`` when configured, else the
  model's generation-config defaults (``render.tokenizer``'s
  ``generation_config.json``, read as vLLM reads it), else the neutral value
  (what was sent is the record's behaviour; what was asked, its original
  request).

Either way the engine's own defaults never apply, so every record knows the
settings its tokens were drawn with. What the engine's logprobs are of
(``engine.logprobs``) completes the record's :class:`~polar.ir.Behaviour`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from polar.ir import (
    Behaviour,
    ChatRequest,
    Distribution,
    EditKind,
    LogprobSource,
    RequestEdit,
    Sampling,
    ToolChoiceMode,
)
from polar.ir.behaviour import SHAPING
from polar.proxy.engines.defaults import NEUTRAL


class SamplingPolicy(BaseModel):
    """A sampling policy on the wire and in configuration files (see the module
    docstring); ``temperature: 0`` is greedy decoding (evaluation only: greedy
    tokens are not trained)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    temperature: float = Field(default=1.0, ge=0, le=100)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=0)
    """0: no limit."""
    min_p: float = Field(default=0.0, ge=0, le=1)

    def distribution(self) -> Distribution:
        return Distribution(
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, min_p=self.min_p
        )

    @classmethod
    def of(cls, distribution: Distribution) -> SamplingPolicy:
        return cls(
            temperature=distribution.temperature,
            top_p=distribution.top_p,
            top_k=distribution.top_k,
            min_p=distribution.min_p,
        )


@dataclass(frozen=True, slots=True)
class SamplingRules:
    """The gateway's rules (see the module docstring). ``defaults`` holds a value
    for every setting that shapes the distribution."""

    defaults: Sampling = NEUTRAL
    policy: Distribution | None = None

    def apply(self, request: ChatRequest, session_policy: Distribution | None) -> ChatRequest:
        """The request as the engine will get it (an enforced policy recorded as an edit)."""
        policy = session_policy or self.policy
        if policy is not None:
            return _enforced(request, policy)
        return _defaulted(request, self.defaults)


def behaviour_of(request: ChatRequest, logprobs: LogprobSource, *, guided: bool) -> Behaviour:
    """The record's behaviour for ``request`` as it goes to the engine. ``guided``:
    the engine applies the request's constraints (engine-rendered capture: JSON
    mode or schema, structured outputs, a forced tool choice) by masking tokens."""
    return Behaviour(
        sampling=request.sampling,
        logprobs=logprobs,
        constrained=guided and constrains(request),
        enforced=any(e.kind is EditKind.ENFORCED_SAMPLING for e in request.edits),
    )


def constrains(request: ChatRequest) -> bool:
    """Whether an engine that honours the request's constraints masks tokens for it."""
    if request.structured_output:
        return True
    if request.response_format and request.response_format.get("type") not in (None, "text"):
        return True
    choice = request.tool_choice
    return bool(
        request.tools
        and choice is not None
        and choice.mode in (ToolChoiceMode.REQUIRED, ToolChoiceMode.NAMED)
    )


def enforced(sampling: Sampling, policy: Distribution) -> Sampling:
    """``sampling`` under ``policy``: its shaping settings replaced, seed and
    logit bias dropped; output limit and stop strings kept."""
    return dataclasses.replace(
        sampling,
        temperature=policy.temperature,
        top_p=policy.top_p,
        top_k=policy.top_k,
        min_p=policy.min_p,
        presence_penalty=NEUTRAL.presence_penalty,
        frequency_penalty=NEUTRAL.frequency_penalty,
        repetition_penalty=NEUTRAL.repetition_penalty,
        seed=None,
        logit_bias={},
    )


def _enforced(request: ChatRequest, policy: Distribution) -> ChatRequest:
    asked = request.sampling
    sampling = enforced(asked, policy)
    changed = [
        f"{name} {_show(getattr(asked, name))}"
        for name in (*SHAPING, "seed")
        if getattr(asked, name) is not None and getattr(asked, name) != getattr(sampling, name)
    ]
    if asked.logit_bias:
        changed.append(f"logit_bias on {len(asked.logit_bias)} token(s)")
    detail = f"sent {policy.describe()} (the session's sampling policy)"
    if changed:
        detail += "; the harness asked " + ", ".join(changed)
    edit = RequestEdit(kind=EditKind.ENFORCED_SAMPLING, detail=detail)
    return dataclasses.replace(request, sampling=sampling, edits=(*request.edits, edit))


def _defaulted(request: ChatRequest, defaults: Sampling) -> ChatRequest:
    asked = request.sampling
    filled = {name: getattr(defaults, name) for name in SHAPING if getattr(asked, name) is None}
    if not filled:
        return request
    return dataclasses.replace(request, sampling=dataclasses.replace(asked, **filled))


def defaults_over(configured: Sampling, model: Sampling) -> Sampling:
    """``configured`` settings, the rest from ``model`` (then neutral)."""
    return Sampling(
        **{
            name: next(
                v
                for v in (getattr(configured, name), getattr(model, name), getattr(NEUTRAL, name))
                if v is not None
            )
            for name in SHAPING
        }
    )


def _show(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
