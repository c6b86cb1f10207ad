"""Builders on hand-made sessions: each case of the chain reading, with exact outcomes.

Sessions are played with the real Qwen3 template (``support.sessions``), in
token-in/token-out capture unless a test says otherwise; every trajectory also
passes the general invariants (``support.trajectories``).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from polar.ir import CaptureMode, FinishReason, RecordStatus, Timings
from polar.proxy.render.template import ChatTemplate
from polar.trajectory import (
    BreakReason,
    BuildConfig,
    BuildInputError,
    ChainClass,
    ClassConfig,
    ClassPolicy,
    ClassRule,
    Fate,
    PerRequest,
    PrefixMerge,
    Relation,
    RuleTarget,
    Trajectory,
    TurnFormat,
    UnknownBuilder,
    resolve_builder,
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

BASH = {"command": "ls"}


@pytest.fixture(scope="module")
def template(tokenizer: Any) -> ChatTemplate:
    return ChatTemplate(tokenizer)


@pytest.fixture(scope="module")
def turns(tokenizer: Any) -> TurnFormat:
    return TurnFormat.from_tokenizer(tokenizer)


@pytest.fixture
def session(template: ChatTemplate) -> Session:
    return Session(template, CaptureMode.TOKEN_IN_TOKEN_OUT)


def build(session: Session, turns: TurnFormat, **config: Any) -> Trajectory:
    trajectory = PrefixMerge(BuildConfig(turns=turns, **config)).build(session.records)
    check_trajectory(session.records, trajectory)
    return trajectory


def relations(trajectory: Trajectory) -> list[Relation]:
    return [d.relation for d in trajectory.drift]


def main(session: Session) -> Conversation:
    return session.conversation("main", ChainClass.MAIN, MAIN_SYSTEM, "Fix the failing test.")


def test_a_clean_session_merges_into_one_trace(session: Session, turns: TurnFormat) -> None:
    conv = main(session)
    first = session.call(conv, Turn(reasoning="Look.", text="(1)", calls=(BASH,)))
    second = session.call(conv, Turn(reasoning="Again.", text="(2)", calls=(BASH,)))
    last = session.call(conv, Turn(text="(3) Done."))
    merged = build(session, turns)
    (trace,) = merged.traces
    assert trace.prompt_ids == first.prompt_ids
    assert trace.prompt_ids + trace.response_ids == last.prompt_ids + last.output_ids
    assert relations(merged) == [Relation.FRESH, Relation.EXTENDS, Relation.EXTENDS]
    # Between two sampled turns: the tool output and the next turn's opening, mask 0.
    span = trace.turns[1]
    gap = trace.response_ids[span.start : span.sampled_start]
    assert session.template.text.decode(gap) == (
        "\n<|im_start|>user\n<tool_response>\nran bash (1)\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )
    assert set(trace.loss_mask[span.start : span.sampled_start]) == {0}
    assert second.prompt_ids == first.prompt_ids + first.output_ids + gap
    single = PerRequest(BuildConfig(turns=turns)).build(session.records)
    check_trajectory(session.records, single)
    assert len(single.traces) == 3
    assert sum(t.tokens for t in single.traces) > 2 * trace.tokens
    assert merged.accounting.delivered_fraction == 1.0
    assert merged.chains[0].chain_class is ChainClass.MAIN


def test_a_truncated_turn_is_closed_by_template_glue_without_a_break(
    session: Session, turns: TurnFormat
) -> None:
    conv = main(session)
    session.call(conv, Turn(text="(1)", calls=(BASH,)))
    cut = session.call(conv, Turn(reasoning="A long thought that goes on", text="(2)", cut=4))
    session.call(conv, Turn(text="(3) Done."))
    assert cut.finish_reason is FinishReason.LENGTH
    assert cut.output_ids[-1] != turns.end_of_turn_id
    merged = build(session, turns)
    assert relations(merged) == [Relation.FRESH, Relation.EXTENDS, Relation.CLOSED]
    (trace,) = merged.traces
    closing = trace.turns[2].start
    # The template's end-of-turn closes the cut turn: glue the model never sampled.
    assert trace.response_ids[closing] == turns.end_of_turn_id
    assert trace.loss_mask[closing] == 0
    assert trace.truncated_turns == merged.accounting.truncated_turns == 1


def test_an_identical_prompt_retry_starts_a_new_trace_and_keeps_both_replies(
    session: Session, turns: TurnFormat
) -> None:
    conv = main(session)
    session.call(conv, Turn(text="(1)", calls=(BASH,)))
    discarded = session.call(conv, Turn(text="(2) unusable"))
    retried = session.retry(conv, Turn(text="(3)", calls=(BASH,)))
    session.call(conv, Turn(text="(4) Done."))
    assert retried.prompt_ids == discarded.prompt_ids
    merged = build(session, turns)
    assert relations(merged)[2] is Relation.RETRY
    first, second = merged.traces
    assert first.records == ("ses_sim/1.1", "ses_sim/2.1")
    assert second.break_reason is BreakReason.RETRY and second.segment == 1
    assert second.prompt_ids == retried.prompt_ids
    assert merged.accounting.breaks == {BreakReason.RETRY: 1}
    assert merged.accounting.delivered == merged.accounting.captured


def test_a_dropped_reply_starts_a_new_trace(session: Session, turns: TurnFormat) -> None:
    conv = main(session)
    session.call(conv, Turn(text="(1)", calls=(BASH,)))
    session.call(conv, Turn(text="(2)", cut=2))
    session.drop_reply(conv, Turn(text="(3) Done."))
    merged = build(session, turns)
    assert relations(merged) == [Relation.FRESH, Relation.EXTENDS, Relation.DROPPED_TURN]
    assert [t.break_reason for t in merged.traces] == [None, BreakReason.DROPPED_TURN]
    assert merged.drift[2].parent == "ses_sim/2.1"


def test_an_edit_of_the_first_prompt_is_an_edited_break(
    session: Session, turns: TurnFormat
) -> None:
    conv = main(session)
    conv.messages.append(user("Context: the tests live in tests/."))
    session.call(conv, Turn(text="(1)", calls=(BASH,)))
    edited = [*conv.sent[:2], user("Context: the tests live in test/."), *conv.messages[3:]]
    session.call(conv, Turn(text="(2) Done."), messages=edited, known=False)
    merged = build(session, turns)
    assert relations(merged) == [Relation.FRESH, Relation.EDITED]
    drift = merged.drift[1]
    assert drift.parent == "ses_sim/1.1"
    assert drift.lineage is not None and drift.lineage.value == "diverged"
    assert drift.agrees_with_lineage is True
    assert [t.break_reason for t in merged.traces] == [None, BreakReason.EDITED]
    assert len(merged.chains) == 1


def test_an_edit_later_in_history_branches_the_conversation(
    session: Session, turns: TurnFormat
) -> None:
    conv = main(session)
    session.call(conv, Turn(text="(1)", calls=(BASH,)))
    session.call(conv, Turn(text="(2)", calls=(BASH,)))
    session.call(conv, Turn(text="(3)", calls=(BASH,)))
    # The harness rewrites the second tool output, then the agent goes on from there.
    session.edit(conv, Turn(text="(4)", calls=(BASH,)), index=5)
    session.call(conv, Turn(text="(5) Done."))
    merged = build(session, turns)
    assert relations(merged)[3] is Relation.EXTENDS
    assert merged.drift[3].parent == "ses_sim/2.1"
    main_chain, branch = merged.chains
    assert main_chain.records == ("ses_sim/1.1", "ses_sim/2.1", "ses_sim/4.1", "ses_sim/5.1")
    assert branch.records == ("ses_sim/3.1",) and branch.forked_from == "ses_sim/2.1"
    # The abandoned reply used a tool: a branch of the main conversation, trained.
    assert branch.chain_class is ChainClass.MAIN
    assert [len(t.turns) for t in merged.traces] == [4, 1]
    assert merged.accounting.breaks == {}


def test_compaction_restarts_a_chain(session: Session, turns: TurnFormat) -> None:
    conv = main(session)
    conv.messages.append(user("Notes: " + "the build is slow; " * 200))
    session.call(conv, Turn(text="(1)", calls=(BASH,)))
    session.call(conv, Turn(text="(2)", calls=(BASH,)))
    restart = main(session)
    restart.messages.append(user("Summary: ran ls twice."))
    session.call(restart, Turn(text="(3)", calls=(BASH,)))
    session.call(restart, Turn(text="(4) Done."))
    merged = build(session, turns)
    assert relations(merged) == [
        Relation.FRESH,
        Relation.EXTENDS,
        Relation.RESTARTED,
        Relation.EXTENDS,
    ]
    assert [c.chain_class for c in merged.chains] == [
        ChainClass.MAIN,
        ChainClass.COMPACTION_RESTART,
    ]
    assert all(t.trainable for t in merged.traces)


def test_failed_aborted_and_retried_calls_are_quarantined_and_the_chain_goes_on(
    session: Session, turns: TurnFormat
) -> None:
    conv = main(session)
    session.call(conv, Turn(text="(1)", calls=(BASH,)))
    session.call(conv, Turn(text="(2)", calls=(BASH,)), outcome="gateway_retry")
    session.call(conv, Turn(text="(3)", calls=(BASH,)), outcome="failed")
    session.call(conv, Turn(text="(4) Done."), outcome="aborted")
    statuses = [(r.seq, r.attempt, r.status) for r in session.records]
    assert statuses == [
        (1, 1, RecordStatus.COMPLETED),
        (2, 1, RecordStatus.FAILED),
        (2, 2, RecordStatus.COMPLETED),
        (3, 1, RecordStatus.FAILED),
        (4, 1, RecordStatus.COMPLETED),
        (5, 1, RecordStatus.ABORTED),
        (6, 1, RecordStatus.COMPLETED),
    ]
    merged = build(session, turns)
    (trace,) = merged.traces
    assert trace.records == ("ses_sim/1.1", "ses_sim/2.2", "ses_sim/4.1", "ses_sim/6.1")
    fates = {f.record: (f.fate, f.generated) for f in merged.accounting.records}
    assert fates["ses_sim/2.1"] == (Fate.FAILED_CALL, 0)
    assert fates["ses_sim/3.1"] == (Fate.FAILED_CALL, 3)
    assert fates["ses_sim/5.1"] == (Fate.ABORTED_CALL, 3)
    assert merged.accounting.quarantined == {Fate.FAILED_CALL: 3, Fate.ABORTED_CALL: 3}
    assert merged.accounting.delivered == merged.accounting.captured - 6


def test_superseded_attempts_and_calls_without_prompt_ids_are_quarantined(
    session: Session, turns: TurnFormat
) -> None:
    conv = main(session)
    first = session.call(conv, Turn(text="(1)", calls=(BASH,)))
    session.call(conv, Turn(text="(2) Done."))
    twice = dataclasses.replace(first, attempt=2)
    blind = dataclasses.replace(session.records[1], seq=3, prompt_ids=())
    session.records[1:1] = [twice]
    session.records.append(blind)
    merged = build(session, turns)
    fates = {f.record: f.fate for f in merged.accounting.records}
    assert fates == {
        "ses_sim/1.1": Fate.SUPERSEDED_ATTEMPT,
        "ses_sim/1.2": Fate.DELIVERED,
        "ses_sim/2.1": Fate.DELIVERED,
        "ses_sim/3.1": Fate.NO_PROMPT_IDS,
    }


def test_missing_and_non_finite_logprobs_are_masked_per_token(
    session: Session, turns: TurnFormat
) -> None:
    conv = main(session)
    session.call(conv, Turn(text="(1)", calls=(BASH,)))
    short = session.call(conv, Turn(text="(2) checking", calls=(BASH,)), logprobs="missing")
    nan = session.call(conv, Turn(text="(3) Done."), logprobs="nan")
    merged = build(session, turns)
    (trace,) = merged.traces
    missing = len(short.output_ids) - len(short.output_logprobs)
    assert missing > 0
    span = trace.turns[1]
    assert (
        trace.logprob_mask[span.sampled_start : span.end]
        == (1,) * len(short.output_logprobs) + (0,) * missing
    )
    assert sum(trace.logprob_mask[trace.turns[2].sampled_start :]) == len(nan.output_ids) - 1
    assert merged.accounting.missing_logprobs == missing + 1
    assert trace.trainable and merged.accounting.delivered == merged.accounting.captured


def test_a_policy_change_starts_a_new_trace(session: Session, turns: TurnFormat) -> None:
    conv = main(session)
    session.call(conv, Turn(text="(1)", calls=(BASH,)))
    session.policy_version = 3
    session.call(conv, Turn(text="(2) Done."))
    merged = build(session, turns)
    assert [(t.policy_version, t.break_reason) for t in merged.traces] == [
        (0, None),
        (3, BreakReason.POLICY_CHANGED),
    ]


def test_side_calls_are_not_trained_unless_their_policy_says_so(
    session: Session, turns: TurnFormat
) -> None:
    title = session.conversation(
        "title", ChainClass.SIDE_CALL, TITLE_SYSTEM, "Fix it.", tools=False
    )
    title_call = session.call(title, Turn(text="Fixing the failing test"))
    conv = main(session)
    session.call(conv, Turn(text="(1)", calls=(BASH,)))
    session.call(conv, Turn(text="(2) Done."))
    merged = build(session, turns).with_reward(1.0)
    side, agent = sorted(merged.traces, key=lambda t: t.chain_class != ChainClass.SIDE_CALL)
    assert (side.chain_class, side.trainable, side.reward) == (ChainClass.SIDE_CALL, False, 0.0)
    assert (agent.chain_class, agent.trainable, agent.reward) == (ChainClass.MAIN, True, 1.0)
    accounting = merged.accounting
    assert accounting.quarantined == {Fate.CLASS_NOT_TRAINED: len(title_call.output_ids)}
    assert accounting.delivered_fraction == pytest.approx(
        1 - len(title_call.output_ids) / accounting.captured
    )
    half = {ChainClass.SIDE_CALL: ClassPolicy(trainable=True, reward_scale=0.5)}
    trained = build(session, turns, classes=ClassConfig(policies=half)).with_reward(2.0)
    side = next(t for t in trained.traces if t.chain_class is ChainClass.SIDE_CALL)
    assert side.trainable and side.reward == 1.0
    assert trained.accounting.delivered_fraction == 1.0


def test_interleaved_sub_agents_become_their_own_merged_chains(
    session: Session, turns: TurnFormat
) -> None:
    conv = main(session)
    subs = [
        session.conversation(f"sub{i}", ChainClass.SUB_AGENT, SUB_SYSTEM, f"Sub-task {i}.")
        for i in range(2)
    ]
    session.call(conv, Turn(text="(1)", calls=(BASH,)))
    for k, who in enumerate([0, 1, 0, 1, 1, 0]):
        session.call(subs[who], Turn(text=f"(s{k})", calls=(BASH,) if k < 4 else ()))
    session.call(conv, Turn(text="(2) Done."))
    merged = build(session, turns)
    assert [(c.chain_class, len(c.records)) for c in merged.chains] == [
        (ChainClass.MAIN, 2),
        (ChainClass.SUB_AGENT, 3),
        (ChainClass.SUB_AGENT, 3),
    ]
    assert len(merged.traces) == 3 and merged.accounting.breaks == {}


def test_a_summary_forked_off_the_conversation_is_a_side_call(
    session: Session, turns: TurnFormat
) -> None:
    conv = main(session)
    session.call(conv, Turn(text="(1)", calls=(BASH,)))
    fork = Conversation("summary", ChainClass.SIDE_CALL, conv.tools, [*conv.messages])
    fork.messages.append(user(SUMMARY_REQUEST))
    session.call(fork, Turn(text="(s) The agent ran ls."))
    session.call(conv, Turn(text="(2) Done."))
    merged = build(session, turns)
    assert [(c.chain_class, c.records, c.forked_from) for c in merged.chains] == [
        (ChainClass.MAIN, ("ses_sim/1.1", "ses_sim/3.1"), None),
        (ChainClass.SIDE_CALL, ("ses_sim/2.1",), "ses_sim/1.1"),
    ]


def test_a_rule_claims_a_summary_structure_cannot_tell_apart(
    session: Session, template: ChatTemplate, turns: TurnFormat
) -> None:
    conv = main(session)
    session.call(conv, Turn(text="(1)", calls=(BASH,)))
    fork = Conversation("summary", ChainClass.SIDE_CALL, conv.tools, [*conv.messages])
    fork.messages.append(user(SUMMARY_REQUEST))
    session.call(fork, Turn(text="(s) The agent ran ls."))
    # Nothing follows: by structure the summary is the conversation's next turn.
    plain = build(session, turns)
    assert [c.chain_class for c in plain.chains] == [ChainClass.MAIN]
    rule = ClassRule(ChainClass.SIDE_CALL, RuleTarget.NEW, r"Summarize the conversation")
    ruled = build(session, turns, classes=ClassConfig(rules=(rule,)), decode=template.text.decode)
    assert [(c.chain_class, c.classified_by) for c in ruled.chains] == [
        (ChainClass.MAIN, "structure: earliest agentic root chain"),
        (ChainClass.SIDE_CALL, "rule: new ~ 'Summarize the conversation'"),
    ]
    with pytest.raises(BuildInputError, match="need a tokenizer"):
        build(session, turns, classes=ClassConfig(rules=(rule,)))


def test_a_model_name_rule_needs_no_tokenizer(session: Session, turns: TurnFormat) -> None:
    conv = main(session)
    session.call(conv, Turn(text="(1)", calls=(BASH,)))
    helper = session.conversation("small-fast", ChainClass.SIDE_CALL, SUB_SYSTEM, "Check.")
    session.call(helper, Turn(text="(h)", calls=(BASH,)))
    session.call(helper, Turn(text="(h2) ok"))
    assert [c.chain_class for c in build(session, turns).chains] == [
        ChainClass.MAIN,
        ChainClass.SUB_AGENT,
    ]
    rule = ClassRule(ChainClass.SIDE_CALL, RuleTarget.MODEL, r"^small-")
    merged = build(session, turns, classes=ClassConfig(rules=(rule,)))
    assert [c.chain_class for c in merged.chains] == [ChainClass.MAIN, ChainClass.SIDE_CALL]


def test_calls_are_ordered_by_sequence_number_not_by_clock(
    session: Session, turns: TurnFormat
) -> None:
    conv = main(session)
    for k in range(4):
        session.call(conv, Turn(text=f"({k})", calls=(BASH,)))
    ordered = build(session, turns)
    shuffled = [
        dataclasses.replace(r, timings=Timings(arrived=-float(r.seq))) for r in session.records
    ]
    random.Random(7).shuffle(shuffled)
    again = PrefixMerge(BuildConfig(turns=turns)).build(shuffled)
    assert again.traces == ordered.traces and again.accounting == ordered.accounting


def test_mixed_or_empty_input_is_refused(session: Session, turns: TurnFormat) -> None:
    conv = main(session)
    record = session.call(conv, Turn(text="(1)"))
    other = dataclasses.replace(record, session_id="ses_other")
    builder = PrefixMerge(BuildConfig(turns=turns))
    with pytest.raises(BuildInputError, match="2 sessions"):
        builder.build([record, other])
    with pytest.raises(BuildInputError, match="no records"):
        builder.build([])


def test_builders_resolve_by_name_or_import_path() -> None:
    assert resolve_builder("prefix_merge") is PrefixMerge
    assert resolve_builder("polar.trajectory.builders:PerRequest") is PerRequest
    for bad, message in [
        ("prefix_merging", "unknown builder 'prefix_merging'"),
        ("no_such_module_xyz:Builder", "cannot import"),
        ("polar.trajectory:NoSuchBuilder", "no callable"),
    ]:
        with pytest.raises(UnknownBuilder, match=message):
            resolve_builder(bad)


def test_the_turn_format_comes_from_the_chat_template(
    tokenizer: Any, template: ChatTemplate, turns: TurnFormat
) -> None:
    decode = template.text.decode
    assert decode([turns.end_of_turn_id]) == "<|im_end|>"
    assert [decode(p) for p in turns.generation_prompts] == ["<|im_start|>assistant\n<think>\n"]
    assert decode(turns.assistant_header) == "<|im_start|>assistant\n"
    other = TurnFormat.from_tokenizer(tokenizer, end_of_turn="<|endoftext|>")
    assert decode([other.end_of_turn_id]) == "<|endoftext|>"
    with pytest.raises(BuildInputError, match="not a single token"):
        TurnFormat.from_tokenizer(tokenizer, end_of_turn="two words")


def test_class_config_is_read_from_plain_data() -> None:
    config = ClassConfig.from_mapping(
        {
            "side_call_max_turns": 2,
            "policies": {"side_call": {"trainable": True}},
            "rules": [{"class": "sub_agent", "target": "model", "pattern": "^helper"}],
        }
    )
    assert config.side_call_max_turns == 2
    assert config.policy(ChainClass.SIDE_CALL) == ClassPolicy(trainable=True, reward_scale=0.0)
    assert config.rules[0].chain_class is ChainClass.SUB_AGENT
    for bad, message in [
        ({"colour": 1}, "unknown fields"),
        ({"policies": {"boss": {}}}, "'boss' is not one of"),
        ({"policies": {"main": {"trainable": "yes"}}}, "trainable"),
        ({"rules": [{"class": "main", "target": "head", "pattern": "("}]}, "pattern"),
        ({"rules": [{"class": "main", "target": "tail", "pattern": "x"}]}, "target"),
        ({"side_call_max_turns": -1}, "side_call_max_turns"),
        ([1], "expected a mapping"),
    ]:
        with pytest.raises(BuildInputError, match=message):
            ClassConfig.from_mapping(bad)


def test_a_record_given_twice_is_refused(session: Session, turns: TurnFormat) -> None:
    record = session.call(main(session), Turn(text="(1)"))
    with pytest.raises(BuildInputError, match="appears more than once"):
        PrefixMerge(BuildConfig(turns=turns)).build([record, record])
