"""The engine pool: affinity, balance by outstanding work, ejection and return.

The end-to-end tests run a real gateway in front of two real scripted-engine HTTP servers;
the unit tests drive :meth:`EnginePool.choose` with a hand-turned clock (no network)."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import pytest

from polar.ir import CaptureMode, RecordStatus
from polar.proxy.config import EngineConfig
from polar.proxy.engines.pool import EnginePool
from polar.proxy.engines.transport import EngineTransport
from polar.proxy.engines.vllm_process import free_port
from polar.proxy.errors import EngineUnavailable
from polar.testing.scripted import ScriptedEngine, script_from_dict

CYCLE = {"turns": [{"text": "ok"}], "cycle": True}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _pool(n: int, clock: Clock, **options: Any) -> EnginePool:
    return EnginePool(
        [EngineTransport(f"http://127.0.0.1:{9000 + i}") for i in range(n)], clock=clock, **options
    )


def _fail(pool: EnginePool, session: str) -> None:
    """What a refused connection does to the engine ``session`` is on."""
    member = pool.choose(session)
    with pytest.raises(EngineUnavailable), pool._using(member):
        raise EngineUnavailable("connection refused")


def test_sessions_stick_to_their_engine_and_new_ones_go_to_the_least_busy() -> None:
    clock = Clock()
    pool = _pool(3, clock)
    first = pool.choose("s1")
    with pool._using(first):  # s1's call is outstanding on engine 0
        second = pool.choose("s2")
        assert second is not first
        with pool._using(second):
            third = pool.choose("s3")
            assert third not in (first, second)
            assert pool.choose("s1") is first  # busy, but s1's own engine
    assert [pool.choose(s) for s in ("s1", "s2", "s3")] == [first, second, third]
    assert [view.requests for view in pool.view()] == [1, 1, 0]
    assert pool.choose(None).url == "http://127.0.0.1:9002"  # idle, and fewest sessions


def test_a_failed_engine_is_left_out_then_tried_again() -> None:
    clock = Clock()
    pool = _pool(2, clock, eject_s=10.0)
    home = pool.choose("s1")
    _fail(pool, "s1")
    assert [view.healthy for view in pool.view()] == [False, True]
    moved = pool.choose("s1")
    assert moved is not home  # the session moved, and stays moved
    clock.now += 11
    assert pool.choose("s1") is moved
    with pool._using(moved):
        assert pool.choose("s9") is home  # back in after eject_s, and the idler one
    with pool._using(home):
        pass
    assert pool.view()[0].healthy and pool.view()[0].failures == 1


def test_with_every_engine_out_the_one_out_longest_is_tried() -> None:
    clock = Clock()
    pool = _pool(2, clock, eject_s=10.0)
    _fail(pool, "a")  # engine 0 out until 110
    clock.now += 1
    _fail(pool, "a")  # engine 1 out until 111
    assert pool.choose("b").url == "http://127.0.0.1:9000"


def test_the_affinity_table_is_bounded() -> None:
    pool = _pool(2, Clock(), max_sessions=4)
    for i in range(10):
        pool.choose(f"s{i}")
    assert len(pool._affinity) == 4
    assert list(pool._affinity) == ["s6", "s7", "s8", "s9"]


def test_the_pool_config_is_validated() -> None:
    base = {"base_url": "http://a:1", "model": "m"}
    assert EngineConfig.model_validate({**base, "pool": ["http://b:2/"]}).urls == (
        "http://a:1",
        "http://b:2",
    )
    assert EngineConfig.model_validate({**base, "pool": ["http://a:1"]}).urls == ("http://a:1",)
    for bad, why in ((["ftp://b"], "must start with http"), (["http://b:2"] * 2, "twice")):
        with pytest.raises(ValueError, match=why):
            EngineConfig.model_validate({**base, "pool": bad})


@pytest.mark.parametrize("capture", [CaptureMode.ENGINE_RENDERED, CaptureMode.TOKEN_IN_TOKEN_OUT])
def test_a_gateway_spreads_sessions_keeps_each_on_one_engine_and_survives_losing_one(
    make_stack: Callable[..., Any], tokenizer: Any, capture: CaptureMode
) -> None:
    second = ScriptedEngine(script_from_dict(CYCLE), tokenizer).start()
    try:
        stack = make_stack(CYCLE, capture=capture, engine={"pool": [second.url], "eject_s": 60})
        second_url = second.url
        engines = {stack.engine.url: stack.engine, second_url: second}
        sessions = [stack.new_session() for _ in range(8)]

        async def session_calls(api_key: str, calls: int) -> None:
            client = stack.openai(api_key)
            for _ in range(calls):
                reply = await asyncio.to_thread(
                    client.chat.completions.create,
                    model="policy",
                    messages=[{"role": "user", "content": "hi"}],
                )
                assert (reply.choices[0].message.content or "").strip() == "ok"

        async def run_all(calls: int) -> None:
            await asyncio.gather(*(session_calls(key, calls) for _, key in sessions))

        for _, key in sessions:  # first calls one at a time: placement by the tie rule
            asyncio.run(session_calls(key, 1))
        asyncio.run(run_all(2))
        where: dict[str, set[str]] = defaultdict(set)
        for url, engine in engines.items():
            for session in engine.sessions:
                assert session is not None
                where[session].add(url)
        assert {sid for sid, _ in sessions} <= set(where)
        assert all(len(urls) == 1 for urls in where.values()), where
        per_engine = Counter(next(iter(urls)) for urls in where.values())
        assert sorted(per_engine.values()) == [4, 4], per_engine

        second.stop()  # its sessions' next calls go to the first engine
        served_before = len(stack.engine.sessions)
        asyncio.run(run_all(1))
        assert len(stack.engine.sessions) - served_before == 8
        for session_id, _ in sessions:
            records = stack.records(session_id)
            completed = [r for r in records if r.status is RecordStatus.COMPLETED]
            assert len(completed) == 4
            failed = [r for r in records if r.status is RecordStatus.FAILED]
            # A call that met the stopped engine before the pool left it out: one
            # failed attempt, retried on the other engine.
            assert len(failed) <= (1 if second_url in where[session_id] else 0)
    finally:
        second.stop()


def test_a_request_that_changes_nothing_is_sent_to_the_next_engine_when_one_is_down(
    tokenizer: Any,
) -> None:
    with ScriptedEngine(script_from_dict(CYCLE), tokenizer) as alive:
        dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
        pool = EnginePool([EngineTransport(dead), EngineTransport(alive.url)])

        async def ask() -> Any:
            try:
                return await pool.get_json("/v1/models")
            finally:
                await pool.aclose()

        reply = asyncio.run(ask())
        assert reply["data"][0]["id"] == "scripted"
        assert [(v.healthy, v.failures) for v in pool.view()] == [(False, 1), (True, 0)]
