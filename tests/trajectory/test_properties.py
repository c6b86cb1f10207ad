"""Builders over generated sessions, with the real Qwen3 tokenizer and chat template.

Each example plays a harness session in one capture mode: a main agent, up to
two sub-agents interleaved with it, a title call, summary requests forked off
the main conversation, replies cut at the length limit, identical-prompt
retries, dropped replies, history edits, compaction, failed, aborted and
gateway-retried calls, missing logprobs and policy changes. Whatever happens:

* merging never changes a sampled token or its logprob, and loss mask 1 sits
  exactly on sampled tokens;
* every generated token is accounted for exactly once (delivered, or
  quarantined with a reason);
* each merged trace is its last call's prompt plus what that call sampled;
* chains get the class of the conversation they came from;
* in token-in/token-out capture, breaks happen exactly where the harness
  retried, dropped a reply or the policy changed, with that reason.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from polar.ir import CaptureMode
from polar.proxy.render.template import ChatTemplate
from polar.trajectory import (
    BuildConfig,
    ChainClass,
    ClassConfig,
    ClassRule,
    PerRequest,
    PrefixMerge,
    RuleTarget,
    Trajectory,
    TurnFormat,
)

from support.sessions import (
    MAIN_SYSTEM,
    SUB_SYSTEM,
    SUMMARY_REQUEST,
    TITLE_SYSTEM,
    Conversation,
    Session,
    Turn,
    user,
)
from support.trajectories import check_trajectory

words = st.text(alphabet=st.sampled_from(list("abcdefgh ijk_./-\"'é中\n")), min_size=1, max_size=16)
arguments = st.one_of(
    st.fixed_dictionaries({"command": words}),
    st.fixed_dictionaries({"path": words, "text": words}),
)
turns = st.builds(
    Turn,
    reasoning=st.one_of(st.none(), words),
    text=words,
    calls=st.lists(arguments, max_size=2).map(tuple),
    cut=st.one_of(st.none(), st.none(), st.none(), st.integers(min_value=1, max_value=14)),
)
tool_turns = st.builds(
    Turn, reasoning=st.one_of(st.none(), words), text=words, calls=st.tuples(arguments)
)
events = st.one_of(
    st.tuples(
        st.just("main"),
        turns,
        st.sampled_from(["ok", "ok", "ok", "gateway_retry", "failed", "aborted"]),
        st.sampled_from(["full", "full", "full", "missing", "nan"]),
    ),
    st.tuples(st.just("sub"), st.integers(min_value=0, max_value=1), turns),
    st.tuples(st.just("summary"), words),
    st.tuples(st.just("retry"), turns),
    st.tuples(st.just("drop"), turns),
    st.tuples(st.just("edit"), st.integers(min_value=0, max_value=99), turns),
    st.tuples(st.just("compact"), tool_turns),
    st.tuples(st.just("policy")),
)


@pytest.fixture(scope="module")
def template(tokenizer: Any) -> ChatTemplate:
    return ChatTemplate(tokenizer)


@pytest.fixture(scope="module")
def config(tokenizer: Any, template: ChatTemplate) -> BuildConfig:
    summaries = ClassRule(ChainClass.SIDE_CALL, RuleTarget.NEW, SUMMARY_REQUEST)
    return BuildConfig(
        turns=TurnFormat.from_tokenizer(tokenizer),
        classes=ClassConfig(rules=(summaries,)),
        decode=template.text.decode,
    )


def play(template: ChatTemplate, capture: CaptureMode, data: Any) -> Session:
    session = Session(template, capture)
    counter = iter(range(10_000))

    def unique(turn: Turn) -> Turn:
        # Every reply says something of its own, so no two replies are the same turn.
        return Turn(turn.reasoning, f"({next(counter)}) {turn.text}", turn.calls, turn.cut)

    if data.draw(st.booleans(), label="title"):
        title = session.conversation(
            "title", ChainClass.SIDE_CALL, TITLE_SYSTEM, "Fix the bug.", tools=False
        )
        session.call(title, unique(data.draw(turns.map(lambda t: Turn(text=t.text)))))
    main = session.conversation("main", ChainClass.MAIN, MAIN_SYSTEM, "Fix the failing test.")
    session.call(main, unique(data.draw(tool_turns, label="first")))
    subs: dict[int, Conversation] = {}
    for step in data.draw(st.lists(events, min_size=1, max_size=10), label="events"):
        match step:
            case ("main", turn, outcome, logprobs):
                session.call(main, unique(turn), outcome=outcome, logprobs=logprobs)
            case ("sub", index, turn):
                if index not in subs:
                    subs[index] = session.conversation(
                        f"sub{index}", ChainClass.SUB_AGENT, SUB_SYSTEM, f"Sub-task {index}."
                    )
                    turn = data.draw(tool_turns)
                session.call(subs[index], unique(turn))
            case ("summary", text):
                fork = Conversation(
                    "summary",
                    ChainClass.SIDE_CALL,
                    main.tools,
                    [*main.messages, user(SUMMARY_REQUEST)],
                )
                session.call(fork, unique(Turn(text=text)))
            case ("retry", turn):
                session.retry(main, unique(turn))
            case ("drop", turn):
                session.drop_reply(main, unique(turn))
            case ("edit", pick, turn):
                editable = session.editable(main)
                if editable:
                    session.edit(main, unique(turn), editable[pick % len(editable)])
            case ("compact", turn):
                summary = f"Summary {next(counter)}: the work so far."
                main = session.conversation(
                    "main", ChainClass.COMPACTION_RESTART, MAIN_SYSTEM, summary
                )
                session.call(main, unique(turn))
            case ("policy",):
                session.policy_version += 1
    return session


def check_classes(session: Session, trajectory: Trajectory) -> None:
    chains = {key: chain for chain in trajectory.chains for key in chain.records}
    for record in session.records:
        chain = chains.get(record.key)
        if chain is None:
            continue
        expected = session.truth[record.key].chain_class
        one_off = len(chain.records) == 1 and not (record.message and record.message.tool_calls)
        if chain.forked_from is not None and one_off:
            # A lone reply left behind by an edit cannot be told from a side call.
            expected = ChainClass.SIDE_CALL
        assert chain.chain_class is expected, (record.key, chain)


def check_breaks(session: Session, trajectory: Trajectory) -> None:
    """Token-in/token-out capture: prompts only change where the harness changed them."""
    where = {t.record: (trace, i) for trace in trajectory.traces for i, t in enumerate(trace.turns)}
    drift = {d.record: d for d in trajectory.drift}
    # A call whose parent went on in another branch (a history edit left it behind,
    # or it is the edited branch) starts a chain of its own: nothing to break.
    forks = {c.records[0] for c in trajectory.chains if c.forked_from is not None}
    for record in session.records:
        truth = session.truth[record.key]
        if truth.relation is None or record.key not in where or record.key in forks:
            continue
        assert drift[record.key].relation is truth.relation, (record.key, drift[record.key])
        trace, position = where[record.key]
        if truth.expected_break is None:
            assert position > 0, f"{record.key} should continue the trace before"
        else:
            assert position == 0 and trace.break_reason is truth.expected_break


@pytest.mark.parametrize("capture", list(CaptureMode))
@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_builders_keep_every_token_and_logprob(
    template: ChatTemplate, config: BuildConfig, capture: CaptureMode, data: Any
) -> None:
    session = play(template, capture, data)
    merged = PrefixMerge(config).build(session.records)
    single = PerRequest(config).build(session.records)
    for trajectory in (merged, single):
        check_trajectory(session.records, trajectory)
        check_classes(session, trajectory)
    # Both builders deliver and quarantine the same tokens for the same reasons.
    assert [(f.record, f.fate) for f in merged.accounting.records] == [
        (f.record, f.fate) for f in single.accounting.records
    ]
    assert all(len(t.turns) == 1 for t in single.traces)
    assert sum(t.tokens for t in merged.traces) <= sum(t.tokens for t in single.traces)
    if capture is CaptureMode.TOKEN_IN_TOKEN_OUT:
        check_breaks(session, merged)
    for name in sorted({d.relation.value for d in merged.drift}):
        event(f"relation {name}")
    for reason in merged.accounting.breaks:
        event(f"break {reason.value}")
    for fate in merged.accounting.quarantined:
        event(f"quarantine {fate.value}")
    for chain in merged.chains:
        event(f"class {chain.chain_class.value}")
