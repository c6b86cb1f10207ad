"""The gateway at RL scale: memory per session and CPU per call, side by side.

    .venv/bin/python benchmarks/gateway.py --scale [--baseline DIR] [--batches 5]

Run by ``benchmarks/gateway.py --scale`` (which holds the fake engine and the
client). Gateways run as ``polar gateway`` processes against the fake engine
(vLLM's chat route for engine-rendered capture, its completions route with
real Qwen3 ids for token-in/token-out). ``--baseline DIR`` names another
source tree of Polar (for example today's main: ``mkdir DIR && git archive
main src | tar -x -C DIR``); a second gateway then runs from ``DIR/src`` and
every figure is printed for both, measured alternately in one run.

* CPU per 1,000 calls: the gateway process's own CPU time (user + system,
  all threads) over a batch of calls, so other load on the machine does not
  count: each thread's ``/proc/PID/task/TID/schedstat`` (nanoseconds), or
  ``/proc/PID/stat`` (10 ms ticks, 0.02 ms in a small batch's 512 calls) when a
  thread ended during the batch. Small calls: 64 sessions, 8 fresh
  two-message calls each. Agent-sized: 8 sessions of 24 turns whose prompts
  grow from about 36k to 37k tokens. Each capture mode, streamed and not.
  Each figure is the median of ``--batches`` batches, the gateways taking
  turns batch by batch.
* Memory (``VmRSS``): 16 agent-sized sessions run to their end and stay open
  (RSS per active session), then are closed; ``--memory-rounds`` rounds, RSS after
  each round against the RSS before the first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gateway import ADMIN, OUTPUT_TOKENS, ROOT, Connection, _admin, _free_port, _wait

CAPTURES = ("engine_rendered", "token_in_token_out")
AGENT_SYSTEM_WORDS = 30_000  # about 36k tokens with the Qwen3 tokenizer
AGENT_TURNS = 24
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Gateway:
    name: str
    port: int
    process: subprocess.Popen[bytes]

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime

    def thread_cpu_ns(self) -> dict[int, int]:
        """Each live thread's CPU time in nanoseconds (``schedstat``'s first field:
        the scheduler's own account, user and system together)."""
        out = {}
        for task in Path(f"/proc/{self.process.pid}/task").iterdir():
            try:
                out[int(task.name)] = int((task / "schedstat").read_text().split()[0])
            except (FileNotFoundError, ProcessLookupError):
                continue  # the thread ended meanwhile
        return out

    def spent_s(self, before: tuple[float, dict[int, int]]) -> float:
        """CPU seconds since ``before`` (a :meth:`mark`): to the nanosecond when
        every thread then is still alive, else from the 10 ms ticks of ``stat``."""
        ticks, threads = before
        now = self.thread_cpu_ns()
        if threads and threads.keys() <= now.keys():
            return sum(ns - threads.get(tid, 0) for tid, ns in now.items()) / 1e9
        return self.cpu_s() - ticks

    def mark(self) -> tuple[float, dict[int, int]]:
        return self.cpu_s(), self.thread_cpu_ns()

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")

    def session(self) -> tuple[str, str]:
        created = _admin(self.port, "POST", "/admin/sessions")
        return created["session_id"], created["api_key"]

    def close(self, session_id: str) -> None:
        import urllib.request

        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/admin/sessions/{session_id}",
            method="DELETE",
            headers={"authorization": f"Bearer {ADMIN}"},
        )
        with urllib.request.urlopen(request):
            pass


LITELLM_KEY = "sk-polar-bench-" + "0" * 48


class LiteLLM(Gateway):
    """LiteLLM's proxy in front of the same engine: it has no sessions, so every
    call carries its master key and there is nothing to close."""

    def session(self) -> tuple[str, str]:
        return "-", LITELLM_KEY

    def close(self, session_id: str) -> None:
        pass


LITELLM_VENV = ROOT / ".cache/venv-litellm/bin/litellm"


def litellm_binary(explicit: Path | None) -> Path | None:
    """``--litellm`` (``off``: none), else ``.cache/venv-litellm`` (``scripts/setup
    --litellm``), else PATH."""
    if explicit is not None:
        return None if str(explicit) == "off" else explicit
    if LITELLM_VENV.exists():
        return LITELLM_VENV
    found = shutil.which("litellm")
    return Path(found) if found else None


@contextlib.contextmanager
def _litellm(binary: Path, engine_port: int, workdir: Path) -> Iterator[Gateway]:
    port = _free_port()
    config = workdir / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: m\n"
        "    litellm_params:\n"
        "      model: openai/m\n"
        f"      api_base: http://127.0.0.1:{engine_port}/v1\n"
        "      api_key: none\n"
    )
    env = {
        **os.environ,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch from the internet at start
        "LITELLM_LOG": "ERROR",
        "LITELLM_MASTER_KEY": LITELLM_KEY,
    }
    process = subprocess.Popen(
        [str(binary), "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
         "--num_workers", "1"],
        env=env,
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait(port, "/health/liveliness", timeout=300, process=process)
        yield LiteLLM("litellm", port, process)
    finally:
        process.terminate()
        process.wait(30)


@contextlib.contextmanager
def _gateway(
    name: str,
    source: Path | None,
    engine_port: int,
    capture: str,
    workdir: Path,
    config: Path | None = None,
) -> Iterator[Gateway]:
    port = _free_port()
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = str(source / "src")
    process = subprocess.Popen(
        [
            sys.executable, "-m", "polar", "gateway", "--port", str(port),
            "--admin-token", ADMIN, "--engine-url", f"http://127.0.0.1:{engine_port}",
            "--engine-model", "m", "--store", str(workdir / f"{name}-{capture}.db"),
            "--capture", capture, "--log-level", "error",
            *(["--config", str(config)] if config is not None else []),
        ],
        cwd=ROOT if source is None else source,
        env=env,
    )  # fmt: skip
    try:
        # Start-up loads the tokenizer: slow on a loaded machine.
        _wait(port, timeout=300, process=process)
        yield Gateway(name, port, process)
    finally:
        process.terminate()
        process.wait(30)


# ---------------------------------------------------------------- clients


def _words(rng: random.Random, n: int) -> str:
    vocabulary = [
        "file", "return", "value", "error", "test", "function", "module", "import",
        "class", "self", "data", "path", "line", "print", "result", "config", "build",
        "check", "patch", "diff", "commit", "branch", "merge", "index", "cache", "token",
    ]  # fmt: skip
    return " ".join(rng.choice(vocabulary) + str(rng.randrange(100)) for _ in range(n))


def _content(reply: bytes, stream: bool) -> str:
    if not stream:
        return json.loads(reply)["choices"][0]["message"].get("content") or ""
    out = []
    for line in reply.split(b"\n"):
        if line.startswith(b"data: {"):
            for choice in json.loads(line[6:]).get("choices") or ():
                out.append((choice.get("delta") or {}).get("content") or "")
    return "".join(out)


def _body(messages: list[dict], stream: bool) -> bytes:
    return json.dumps(
        {
            "model": "m",
            "messages": messages,
            "stream": stream,
            "max_tokens": OUTPUT_TOKENS,
            "logprobs": True,
            "top_logprobs": 0,
            **({"stream_options": {"include_usage": True}} if stream else {}),
        }
    ).encode()


async def _agent(port: int, key: str, system: str, stream: bool, seed: int) -> int:
    """One agent-sized session: each turn resends the conversation, answers
    included, and adds a tool result of about 50 tokens."""
    rng = random.Random(seed)
    conn = Connection(port)
    auth = {"authorization": f"Bearer {key}"}
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": f"task {seed}: " + _words(rng, 40)},
    ]
    for _ in range(AGENT_TURNS):
        _, _, reply = await conn.post("/v1/chat/completions", _body(messages, stream), auth)
        messages.append({"role": "assistant", "content": _content(reply, stream)})
        messages.append({"role": "user", "content": "tool output: " + _words(rng, 40)})
    assert conn.writer is not None
    conn.writer.close()
    return AGENT_TURNS


async def _small(port: int, key: str, stream: bool, calls: int) -> int:
    conn = Connection(port)
    messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "hi"},
    ]
    for _ in range(calls):
        await conn.post(
            "/v1/chat/completions", _body(messages, stream), {"authorization": f"Bearer {key}"}
        )
    assert conn.writer is not None
    conn.writer.close()
    return calls


def _cpu_per_1000(gateway: Gateway, size: str, stream: bool, system: str, seed: int) -> float:
    """Gateway CPU-seconds per 1,000 calls over one batch (its sessions closed after)."""
    count = 64 if size == "small" else 8
    sessions = [gateway.session() for _ in range(count)]

    async def batch() -> int:
        if size == "small":
            runs = [_small(gateway.port, key, stream, 8) for _, key in sessions]
        else:
            runs = [
                _agent(gateway.port, key, system, stream, seed + i)
                for i, (_, key) in enumerate(sessions)
            ]
        return sum(await asyncio.gather(*runs))

    before = gateway.mark()
    calls = asyncio.run(batch())
    spent = gateway.spent_s(before)
    for session_id, _ in sessions:
        gateway.close(session_id)
    return spent / calls * 1000


def _open_sessions(gateway: Gateway, system: str, count: int, seed: int) -> list[str]:
    """Run ``count`` agent-sized sessions to their end; returns their ids (still open)."""
    opened = [gateway.session() for _ in range(count)]

    async def run() -> None:
        await asyncio.gather(
            *(
                _agent(gateway.port, key, system, True, seed + i)
                for i, (_, key) in enumerate(opened)
            )
        )

    asyncio.run(run())
    return [session_id for session_id, _ in opened]


def _close(gateway: Gateway, session_ids: list[str]) -> float:
    for session_id in session_ids:
        gateway.close(session_id)
    time.sleep(0.5)  # the store's writer applies the closes
    return gateway.rss_mb()


def _memory(gateway: Gateway, system: str, rounds: int, sessions: int = 16) -> list[str]:
    """A warm-up round (the process's first use of its caches and allocator
    arenas), then two groups of sessions left open (the second group's growth
    is what an active session holds), then rounds of sessions closed after use."""
    name = f"  {gateway.name:<9}"
    start = gateway.rss_mb()
    warm = _close(gateway, _open_sessions(gateway, system, sessions, 0))
    first = _open_sessions(gateway, system, sessions, 1000)
    one = gateway.rss_mb()
    second = _open_sessions(gateway, system, sessions, 2000)
    two = gateway.rss_mb()
    lines = [
        f"{name} RSS at start {start:,.0f} MB, after a warm-up round of {sessions} closed "
        f"sessions {warm:,.0f} MB (the baseline)",
        f"{name} {sessions} sessions open {one:,.0f} MB, {2 * sessions} open {two:,.0f} MB: "
        f"{(two - one) / sessions:,.2f} MB per active session "
        f"({(one - warm) / sessions:,.2f} MB for the first {sessions})",
    ]
    closed = _close(gateway, first + second)
    lines.append(
        f"{name} all closed {closed:,.0f} MB ({(closed - warm) / warm:+.1%} from baseline)"
    )
    for r in range(rounds):
        closed = _close(gateway, _open_sessions(gateway, system, sessions, 10_000 * (r + 1)))
        lines.append(
            f"{name} round {r + 1:>2} of {sessions} sessions closed after use: {closed:,.0f} MB "
            f"({(closed - warm) / warm:+.1%} from baseline)"
        )
    return lines


def main(
    baseline: Path | None,
    rounds: int,
    baseline_rounds: int,
    modes: list[str],
    parts: list[str],
    config: Path | None = None,
    batches: int = 5,
    litellm: Path | None = None,
    sizes: list[str] | None = None,
) -> None:
    """``config``: a YAML gateway config for this tree's gateway (e.g.
    ``gc_young_threshold: 700`` to see what the collector's tuning buys).
    ``batches``: CPU batches per figure; the gateways take turns batch by
    batch and each figure is the median of its batches (a batch of small
    calls lasts well under a second, so one alone carries the machine's noise).
    ``litellm``: LiteLLM's ``litellm`` executable (found by :func:`litellm_binary`
    when not given): its CPU per call is measured beside engine-rendered capture,
    the one it is comparable with (it relays chat calls and records nothing)."""
    litellm = litellm_binary(litellm)
    engine_port = _free_port()
    engine = subprocess.Popen(
        [sys.executable, str(ROOT / "benchmarks/gateway.py"), "--serve-engine", str(engine_port)]
    )
    workdir = Path(tempfile.mkdtemp(prefix="polar-bench-scale-"))
    system = _words(random.Random(7), AGENT_SYSTEM_WORDS)
    variants: list[tuple[str, Path | None]] = [("this", None)]
    if baseline is not None:
        variants.insert(0, ("baseline", baseline))
    try:
        _wait(engine_port, "/", process=engine)
        print(
            f"cores={os.cpu_count()}; gateway CPU-seconds per 1,000 calls (its own user+system "
            f"time), median of {batches} batches taken in turns; small: 64 sessions x 8 calls; "
            f"agent: 8 sessions x {AGENT_TURNS} turns, prompts ~36-37k tokens"
        )
        for capture in modes:
            with contextlib.ExitStack() as stack:
                gateways = [
                    stack.enter_context(
                        _gateway(
                            name,
                            source,
                            engine_port,
                            capture,
                            workdir,
                            config if source is None else None,
                        )
                    )
                    for name, source in variants
                ]
                if capture == "engine_rendered" and litellm is not None and "cpu" in parts:
                    gateways.append(stack.enter_context(_litellm(litellm, engine_port, workdir)))
                failed: dict[str, str] = {}  # LiteLLM, when it failed a call: why
                for size in (sizes or ["small", "agent"]) if "cpu" in parts else ():
                    for stream in (False, True):
                        runs: list[list[float]] = [[] for _ in gateways]
                        for b in range(batches):
                            for k, g in enumerate(gateways):
                                if g.name in failed:
                                    continue
                                seed = 10_000 * k + 100 * b
                                try:
                                    runs[k].append(_cpu_per_1000(g, size, stream, system, seed))
                                except (OSError, asyncio.IncompleteReadError) as exc:
                                    if not isinstance(g, LiteLLM):
                                        raise
                                    # The comparison's own failure does not end the run.
                                    failed[g.name] = f"{type(exc).__name__}: {exc}"[:200]
                                    print(f"  {g.name} failed a call, left out: {failed[g.name]}")
                        figures = [statistics.median(r) if r else None for r in runs]
                        row = "  ".join(
                            f"{g.name} {f:7.2f}" if f is not None else f"{g.name}  failed"
                            for g, f in zip(gateways, figures, strict=True)
                        )
                        this = figures[[g.name for g in gateways].index("this")]
                        assert this is not None
                        ratio = "".join(
                            f"  ({g.name}/this {f / this:.2f}x)"
                            for g, f in zip(gateways, figures, strict=True)
                            if g.name != "this" and f is not None
                        )
                        print(
                            f"{capture:<19} {size:<6} {'stream' if stream else 'whole':<7} "
                            f"{row}{ratio}",
                            flush=True,
                        )
                for g in gateways if "memory" in parts else ():
                    if isinstance(g, LiteLLM):
                        continue
                    n = baseline_rounds if g.name == "baseline" else rounds
                    if n < 0:
                        continue
                    print(f"memory, {capture}:", flush=True)
                    for line in _memory(g, system, n):
                        print(line, flush=True)
    finally:
        engine.terminate()
        engine.wait(10)
