"""Builders on sessions the real agent CLIs ran through the gateway, in both capture modes.

The fixtures are ``tests/fixtures/sessions/<cli>.<capture>.jsonl`` (one record
per line, as ``polar records`` prints them); every file there is tested, and
the CLIs recorded so far must be present in both modes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import orjson
import pytest

from polar.ir import (
    CaptureMode,
    CompletionRecord,
    DeliveryFlag,
    DeliveryIssue,
    MalformedToolCall,
    PromptOrigin,
)
from polar.ir.codec import record_from_json
from polar.trajectory import (
    BreakReason,
    BuildConfig,
    ChainClass,
    Fate,
    PerRequest,
    PrefixMerge,
    Relation,
    TurnFormat,
)

from support.paths import FIXTURES
from support.trajectories import check_trajectory

SESSIONS = FIXTURES / "sessions"
REQUIRED = {"codex", "qwen_code", "pi", "mini_swe_agent"}
FILES = sorted(SESSIONS.glob("*.jsonl"))


def load(path: Path) -> list[CompletionRecord]:
    return [record_from_json(orjson.loads(line)) for line in path.read_bytes().splitlines()]


def test_the_recorded_clis_are_all_there_in_both_modes() -> None:
    present = {tuple(p.name.split(".")[:2]) for p in FILES}
    for cli in REQUIRED:
        for mode in CaptureMode:
            assert (cli, mode.value) in present, f"missing fixture {cli}.{mode.value}.jsonl"


@pytest.fixture(scope="module")
def config(tokenizer: Any) -> BuildConfig:
    return BuildConfig(turns=TurnFormat.from_tokenizer(tokenizer))


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_recorded_sessions_build_with_every_token_delivered(
    path: Path, config: BuildConfig
) -> None:
    records = load(path)
    records_by_key = {r.key: r for r in records}
    assert {r.capture.value for r in records} == {path.stem.split(".")[1]}
    merged = PrefixMerge(config).build(records)
    single = PerRequest(config).build(records)
    for trajectory in (merged, single):
        check_trajectory(records, trajectory)
        # The agent's conversation is the main chain; anything else these CLIs sent
        # is a one-off call without tools (opencode's title), kept out of training.
        classes = [c.chain_class for c in trajectory.chains]
        assert classes.count(ChainClass.MAIN) == 1
        assert set(classes) <= {ChainClass.MAIN, ChainClass.SIDE_CALL}
        side = sum(
            len(records_by_key[k].output_ids)
            for c in trajectory.chains
            if c.chain_class is ChainClass.SIDE_CALL
            for k in c.records
        )
        accounting = trajectory.accounting
        assert dict(accounting.quarantined) == ({Fate.CLASS_NOT_TRAINED: side} if side else {})
        assert accounting.delivered == accounting.captured - side
    assert len(single.traces) == len(records)
    # Drift measured by the builder is the drift the gateway measured when it served the call.
    for drift in merged.drift:
        if drift.relation is Relation.FRESH:
            # A new conversation; the gateway may have seen a few shared tokens
            # inside the first turn (the template's opening of a system prompt).
            head = config.turns.head_length(records_by_key[drift.record].prompt_ids)
            assert drift.lineage is PromptOrigin.FRESH or (
                drift.lineage is PromptOrigin.DIVERGED and (drift.lineage_shared_tokens or 0) < head
            )
            continue
        assert drift.agrees_with_lineage is True, drift
        expected = {
            Relation.EXTENDS: PromptOrigin.EXTENDS,
            Relation.CLOSED: PromptOrigin.EXTENDS,
            Relation.REWRITTEN: PromptOrigin.REWRITTEN,
        }[drift.relation]
        assert drift.lineage is expected
    if records[0].capture is CaptureMode.TOKEN_IN_TOKEN_OUT:
        # Append-only prompts: one trace per chain, far fewer tokens to train on.
        assert len(merged.traces) == len(merged.chains)
        assert merged.accounting.breaks == {}
        assert sum(t.tokens for t in merged.traces) < sum(t.tokens for t in single.traces)


@pytest.mark.parametrize("cli", sorted({p.name.split(".")[0] for p in FILES}))
def test_drift_report_of_the_same_cli_in_both_modes(cli: str, config: BuildConfig) -> None:
    """Token mode never drifts; engine mode drifts exactly where the template
    re-rendered a reply, and each drift is a break, never a loss."""
    paths = {mode: SESSIONS / f"{cli}.{mode.value}.jsonl" for mode in CaptureMode}
    if not all(p.exists() for p in paths.values()):
        pytest.skip(f"{cli} is recorded in one capture mode only")
    token = PrefixMerge(config).build(load(paths[CaptureMode.TOKEN_IN_TOKEN_OUT]))
    engine = PrefixMerge(config).build(load(paths[CaptureMode.ENGINE_RENDERED]))
    assert {d.relation for d in token.drift} <= {Relation.FRESH, Relation.EXTENDS}
    rewritten = [d for d in engine.drift if d.relation is Relation.REWRITTEN]
    assert engine.accounting.breaks.get(BreakReason.REWRITTEN, 0) == len(rewritten)
    for drift in rewritten:
        # Drift starts inside the re-rendered reply, not before it.
        assert drift.shared_tokens < drift.base_tokens
    assert len(engine.traces) == len(engine.chains) + len(rewritten)
    assert engine.accounting.delivered == token.accounting.delivered + (
        engine.accounting.captured - token.accounting.captured
    )


def test_a_title_call_is_a_side_call_and_not_trained(config: BuildConfig) -> None:
    path = SESSIONS / "opencode.token_in_token_out.jsonl"
    if not path.exists():
        pytest.skip("no opencode recording")
    records = load(path)
    merged = PrefixMerge(config).build(records)
    title, agent = merged.chains
    assert (title.chain_class, title.records) == (ChainClass.SIDE_CALL, (records[0].key,))
    assert agent.chain_class is ChainClass.MAIN and len(agent.records) == len(records) - 1
    assert merged.accounting.quarantined == {Fate.CLASS_NOT_TRAINED: len(records[0].output_ids)}
    assert merged.delivered_fraction < 1.0


def test_delivery_flags_and_malformed_calls_are_counted_in_the_accounting(
    config: BuildConfig,
) -> None:
    """Every flag on every record of the session is counted, whatever the
    record's fate, and so is every malformed tool call."""
    records = load(SESSIONS / "opencode.engine_rendered.jsonl")
    text_differs = DeliveryFlag(DeliveryIssue.ENGINE_TEXT_DIFFERS, "text: sampled 'a', gave ''")
    withdrawn = DeliveryFlag(DeliveryIssue.STREAMED_CALL_WITHDRAWN, "tool call 0")
    flagged = [
        dataclasses.replace(
            records[0],
            delivery_flags=(text_differs, withdrawn),
            malformed_tool_calls=(MalformedToolCall(raw="<tool_call>{", reason="not JSON"),),
        ),
        dataclasses.replace(records[1], delivery_flags=(text_differs,)),
        *records[2:],
    ]
    for builder in (PerRequest(config), PrefixMerge(config)):
        accounting = builder.build(flagged).accounting
        assert dict(accounting.delivery_flags) == {
            DeliveryIssue.ENGINE_TEXT_DIFFERS: 2,
            DeliveryIssue.STREAMED_CALL_WITHDRAWN: 1,
        }
        assert accounting.malformed_tool_calls == 1
        clean = builder.build(records).accounting
        assert dict(clean.delivery_flags) == {} and clean.malformed_tool_calls == 0
