"""What each chain is (main agent, sub-agent, side call, compaction restart),
and how each class is trained.

**Structure first.** A chain's first turn (system prompt and tool definitions,
as rendered) is its *head*; a chain is *trivial* when it has at most
``side_call_max_turns`` calls and never calls a tool; it is a *fork* when its
first prompt continues a call of another chain. Then, in order:

1. The main chain is the earliest non-trivial root chain (if every root is
   trivial: the one that sampled the most tokens).
2. A trivial chain is a side call (titles, summaries, memory notes, next-speaker
   checks: one answer, no tools used). This includes a trivial fork, such as a
   summary request sent with the main conversation's history.
3. A non-trivial fork is a branch of the conversation it forks from (history
   edited or rolled back, or an agent forked with its parent's context) and
   gets that chain's class.
4. A non-trivial root with the main chain's head is a compaction restart when no
   earlier chain with that head is still running once it starts; otherwise,
   like a root with any other head, it is a sub-agent.

**Rules override structure.** Harnesses make calls structure cannot tell
apart, such as a summary request that extends the main conversation with the
same tools. A :class:`ClassRule` matches a regular expression against a call's
requested model name, its decoded first turn, or the decoded tokens its prompt
adds to what it continues; a call that matches starts a chain of the rule's
class, unless it continues a call claimed for the same class (rules other
than ``model`` need a ``decode`` function). The first matching rule wins.

**Policies.** Each class has a :class:`ClassPolicy`: whether its traces are
trained, and the factor applied to the session's outcome reward. By default
side calls are not trained (scale 0); every other class gets the full reward.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, TypeVar

from polar.ir import CompletionRecord
from polar.trajectory.chains import Link
from polar.trajectory.errors import BuildInputError
from polar.trajectory.trace import ChainClass
from polar.trajectory.turns import TurnFormat

Decode = Callable[[Sequence[int]], str]
_E = TypeVar("_E", bound=StrEnum)


class RuleTarget(StrEnum):
    MODEL = "model"
    """The model name the harness asked for (``original_request["model"]``)."""
    HEAD = "head"
    """The decoded first turn of the call's prompt."""
    NEW = "new"
    """The decoded tokens the call's prompt adds to the call it continues."""


@dataclass(frozen=True, slots=True)
class ClassRule:
    chain_class: ChainClass
    target: RuleTarget
    pattern: str
    _regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "_regex", re.compile(self.pattern))
        except re.error as exc:
            raise BuildInputError(f"class rule pattern {self.pattern!r}: {exc}") from None

    def matches(self, text: str) -> bool:
        return self._regex.search(text) is not None

    def describe(self) -> str:
        return f"rule: {self.target.value} ~ {self.pattern!r}"


@dataclass(frozen=True, slots=True)
class ClassPolicy:
    trainable: bool
    reward_scale: float = 1.0


DEFAULT_POLICIES: Mapping[ChainClass, ClassPolicy] = MappingProxyType(
    {
        ChainClass.MAIN: ClassPolicy(trainable=True, reward_scale=1.0),
        ChainClass.SUB_AGENT: ClassPolicy(trainable=True, reward_scale=1.0),
        ChainClass.COMPACTION_RESTART: ClassPolicy(trainable=True, reward_scale=1.0),
        ChainClass.SIDE_CALL: ClassPolicy(trainable=False, reward_scale=0.0),
    }
)


@dataclass(frozen=True, slots=True)
class ClassConfig:
    rules: tuple[ClassRule, ...] = ()
    side_call_max_turns: int = 1
    policies: Mapping[ChainClass, ClassPolicy] = field(default_factory=lambda: DEFAULT_POLICIES)

    def policy(self, chain_class: ChainClass) -> ClassPolicy:
        return self.policies.get(chain_class, DEFAULT_POLICIES[chain_class])

    @classmethod
    def from_mapping(cls, data: Any) -> ClassConfig:
        """From plain data (a YAML file's content)::

        side_call_max_turns: 1
        policies:
          side_call: {trainable: false, reward_scale: 0.0}
        rules:
          - {class: side_call, target: new, pattern: "Summarize the conversation"}
        """
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise BuildInputError("class config: expected a mapping")
        unknown = set(data) - {"rules", "side_call_max_turns", "policies"}
        if unknown:
            raise BuildInputError(f"class config: unknown fields {sorted(unknown)}")
        turns = data.get("side_call_max_turns", 1)
        if not isinstance(turns, int) or isinstance(turns, bool) or turns < 0:
            raise BuildInputError("class config: side_call_max_turns must be an integer >= 0")
        policies = dict(DEFAULT_POLICIES)
        for name, raw in (data.get("policies") or {}).items():
            where = f"class config: policies.{name}"
            chain_class = _enum(ChainClass, name, where)
            if not isinstance(raw, Mapping) or set(raw) - {"trainable", "reward_scale"}:
                raise BuildInputError(f"{where}: expected {{trainable, reward_scale}}")
            base = policies[chain_class]
            trainable = raw.get("trainable", base.trainable)
            scale = raw.get("reward_scale", base.reward_scale)
            if not isinstance(trainable, bool):
                raise BuildInputError(f"{where}.trainable: expected true or false")
            if not isinstance(scale, int | float) or isinstance(scale, bool):
                raise BuildInputError(f"{where}.reward_scale: expected a number")
            policies[chain_class] = ClassPolicy(trainable, float(scale))
        rules = []
        for i, raw in enumerate(data.get("rules") or ()):
            where = f"class config: rules[{i}]"
            if not isinstance(raw, Mapping) or set(raw) != {"class", "target", "pattern"}:
                raise BuildInputError(f"{where}: expected {{class, target, pattern}}")
            rules.append(
                ClassRule(
                    chain_class=_enum(ChainClass, raw["class"], f"{where}.class"),
                    target=_enum(RuleTarget, raw["target"], f"{where}.target"),
                    pattern=str(raw["pattern"]),
                )
            )
        return cls(
            rules=tuple(rules), side_call_max_turns=turns, policies=MappingProxyType(policies)
        )


def _enum(kind: type[_E], value: Any, where: str) -> _E:
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(m.value for m in kind)
        raise BuildInputError(f"{where}: {value!r} is not one of {allowed}") from None


# ---------------------------------------------------------------- classifying


class RuleClaims:
    """Calls the class rules claim, found call by call while parents are linked
    (a claimed call starts a chain of the rule's class)."""

    def __init__(
        self,
        config: ClassConfig,
        calls: Sequence[CompletionRecord],
        fmt: TurnFormat,
        decode: Decode | None,
    ) -> None:
        if decode is None and any(r.target is not RuleTarget.MODEL for r in config.rules):
            raise BuildInputError("class rules on head or new tokens need a tokenizer to decode")
        self.rules = config.rules
        self.calls = calls
        self.fmt = fmt
        self.decode = decode
        self.claimed: dict[int, tuple[ChainClass, str]] = {}

    def __call__(self, i: int, link: Link) -> bool:
        texts: dict[RuleTarget, str] = {}
        for rule in self.rules:
            if rule.target not in texts:
                texts[rule.target] = _text(rule.target, self.calls[i], link, self.fmt, self.decode)
            if rule.matches(texts[rule.target]):
                self.claimed[i] = (rule.chain_class, rule.describe())
                return True
        return False


def _text(
    target: RuleTarget, call: CompletionRecord, link: Link, fmt: TurnFormat, decode: Decode | None
) -> str:
    match target:
        case RuleTarget.MODEL:
            return str(call.original_request.get("model", ""))
        case RuleTarget.HEAD:
            assert decode is not None
            return decode(call.prompt_ids[: fmt.head_length(call.prompt_ids)])
        case RuleTarget.NEW:
            assert decode is not None
            return decode(call.prompt_ids[link.new_from :])


def classify(
    chains: Sequence[Sequence[int]],
    calls: Sequence[CompletionRecord],
    links: Sequence[Link],
    config: ClassConfig,
    claimed: Mapping[int, tuple[ChainClass, str]],
) -> list[tuple[ChainClass, str]]:
    """The class of each chain, with the rule that decided it."""
    facts = [_Facts.of(chain, calls, links, config.side_call_max_turns) for chain in chains]
    out: list[tuple[ChainClass, str] | None] = [claimed.get(chain[0]) for chain in chains]
    main = next((k for k, c in enumerate(out) if c and c[0] is ChainClass.MAIN), None)
    if main is None:
        free = [k for k, c in enumerate(out) if c is None and not facts[k].fork]
        agentic = [k for k in free if not facts[k].trivial]
        if agentic:
            main = agentic[0]
            out[main] = (ChainClass.MAIN, "structure: earliest agentic root chain")
        elif free:
            main = max(free, key=lambda k: (facts[k].sampled, -k))
            out[main] = (ChainClass.MAIN, "structure: root chain that sampled the most")
    main_head = facts[main].head if main is not None else None
    chain_of = {i: k for k, chain in enumerate(chains) for i in chain}
    for k, f in enumerate(facts):
        if out[k] is not None:
            continue
        parent = links[chains[k][0]].parent
        if f.trivial:
            out[k] = (ChainClass.SIDE_CALL, "structure: one-off call without tool use")
        elif parent is not None:
            origin = out[chain_of[parent]]
            assert origin is not None  # chains are ordered by first call
            out[k] = (origin[0], f"structure: branch of chain {chain_of[parent]}")
        elif f.head == main_head and not any(
            facts[j].head == main_head and facts[j].last > f.first for j in range(k)
        ):
            out[k] = (ChainClass.COMPACTION_RESTART, "structure: main head, restarted")
        else:
            out[k] = (ChainClass.SUB_AGENT, "structure: agentic root chain")
    return [c for c in out if c is not None]


@dataclass(frozen=True, slots=True)
class _Facts:
    head: object
    fork: bool
    trivial: bool
    sampled: int
    first: int
    last: int

    @classmethod
    def of(
        cls,
        chain: Sequence[int],
        calls: Sequence[CompletionRecord],
        links: Sequence[Link],
        max_turns: int,
    ) -> _Facts:
        uses_tools = any(_calls_tools(calls[i]) for i in chain)
        return cls(
            head=links[chain[0]].head,
            fork=links[chain[0]].parent is not None,
            trivial=len(chain) <= max_turns and not uses_tools,
            sampled=sum(len(calls[i].output_ids) for i in chain),
            first=chain[0],
            last=chain[-1],
        )


def _calls_tools(call: CompletionRecord) -> bool:
    return call.message is not None and bool(call.message.tool_calls)
