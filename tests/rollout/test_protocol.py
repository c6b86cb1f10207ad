"""The typed ``SessionResult.accounting`` and ``samples`` write the same JSON the
untyped dicts did, byte for byte, on sessions the real CLIs ran (the recorded
fixtures), and read it back unchanged."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
import pytest
from pydantic import TypeAdapter

from polar.ir import DeliveryFlag, DeliveryIssue, MalformedToolCall, Unreproducible
from polar.ir.codec import record_from_json
from polar.rollout.protocol import SessionAccounting, SessionResult, SessionStatus
from polar.trajectory import BuildConfig, PrefixMerge, Trajectory, TurnFormat, row_of, samples_of
from polar.trajectory.export import FIELDS

from support.paths import FIXTURES

FILES = sorted((FIXTURES / "sessions").glob("*.jsonl"))


def untyped_wire(trajectory: Trajectory) -> bytes:
    """``accounting`` and ``samples`` as the node wrote them when both were plain dicts."""
    a = trajectory.accounting
    accounting = {
        "captured": a.captured,
        "delivered": a.delivered,
        "delivered_fraction": a.delivered_fraction,
        "missing_logprobs": a.missing_logprobs,
        "quarantined": {k.value: v for k, v in a.quarantined.items()},
        "breaks": {k.value: v for k, v in a.breaks.items()},
        "malformed_tool_calls": a.malformed_tool_calls,
        "delivery_flags": {k.value: v for k, v in a.delivery_flags.items()},
        "unreproducible": {k.value: v for k, v in a.unreproducible.items()},
    }
    samples = []
    for sample in samples_of(trajectory, include_untrainable=True):
        row = {name: getattr(sample, name) for name in FIELDS[:-2]}
        row["turn_offsets"] = [
            {"record": s.record, "start": s.start, "sampled_start": s.sampled_start, "end": s.end}
            for s in sample.turn_offsets
        ]
        unknown = isinstance(sample.sampling, Unreproducible)
        row["sampling"] = None if unknown else dataclasses.asdict(sample.sampling)
        row["unreproducible"] = sample.sampling if unknown else None
        samples.append(row)
    return TypeAdapter(dict[str, Any]).dump_json({"accounting": accounting, "samples": samples})


def result_of(trajectory: Trajectory | None) -> SessionResult:
    kept = samples_of(trajectory, include_untrainable=True) if trajectory is not None else []
    return SessionResult(
        session_id="s",
        task_id="t",
        sample_index=0,
        status=SessionStatus.COMPLETED,
        reward=1.0,
        accounting=SessionAccounting.of(trajectory.accounting) if trajectory else None,
        samples=[row_of(x) for x in kept],
    )


@pytest.fixture(scope="module")
def trajectories(tokenizer: Any) -> dict[str, Trajectory]:
    """Every recorded session, and one with delivery flags and a malformed call."""
    builder = PrefixMerge(BuildConfig(turns=TurnFormat.from_tokenizer(tokenizer)))
    sessions = {
        path.stem: [record_from_json(orjson.loads(line)) for line in path.read_bytes().splitlines()]
        for path in FILES
    }
    first, *rest = sessions["opencode.engine_rendered"]
    sessions["flagged"] = [
        dataclasses.replace(
            first,
            delivery_flags=(
                DeliveryFlag(DeliveryIssue.ENGINE_TEXT_DIFFERS, "text: sampled 'a', gave ''"),
                DeliveryFlag(DeliveryIssue.STREAMED_CALL_WITHDRAWN, "tool call 0"),
            ),
            malformed_tool_calls=(MalformedToolCall(raw="<tool_call>{", reason="not JSON"),),
        ),
        *rest,
    ]
    return {name: builder.build(records) for name, records in sessions.items()}


def test_typed_accounting_and_samples_write_the_untyped_json(
    trajectories: dict[str, Trajectory],
) -> None:
    assert any(t.accounting.quarantined for t in trajectories.values())
    assert any(t.accounting.breaks for t in trajectories.values())
    assert any(t.accounting.delivery_flags for t in trajectories.values())
    for name, trajectory in trajectories.items():
        result = result_of(trajectory)
        wire = result.model_dump_json(include={"accounting", "samples"})
        assert wire.encode() == untyped_wire(trajectory), name
        whole = result.model_dump_json()
        assert SessionResult.model_validate_json(whole).model_dump_json() == whole, name


def test_a_result_without_a_trajectory_has_empty_accounting_on_the_wire() -> None:
    result = result_of(None)
    wire = result.model_dump_json()
    assert orjson.loads(wire)["accounting"] == {} and orjson.loads(wire)["samples"] == []
    assert SessionResult.model_validate_json(wire).accounting is None
