"""Latency the gateway adds, and bytes it stores per session.

    .venv/bin/python benchmarks/gateway.py [--calls 4] [--levels 1,64,256]
    .venv/bin/python benchmarks/gateway.py --scale [--baseline DIR]
    .venv/bin/python benchmarks/gateway.py --workers 1,2 [--sessions 32]

``--workers`` measures instead the throughput of ``polar gateway --workers N``
beside one worker, and the cost of the router's hop (see
``benchmarks/gateway_workers.py``).

``--scale`` measures instead memory per session and CPU per call, beside
another source tree's gateway (see ``benchmarks/gateway_scale.py``).

Three processes: a fast fake engine (vLLM's chat wire format, no model, no
tokenizer), the gateway (`polar gateway`, uvloop + httptools, default SQLite
durability), and this load generator (a minimal keep-alive HTTP/1.1 client).
For each concurrency level and each mode (streaming, non-streaming) the same
calls go to the engine directly and through the gateway, alternating rounds,
in one run. Reported: p50/p99 latency of each, their difference (the added
latency), and for streaming the time to first byte of each.

Then one long session (growing history, like a harness) goes through the
gateway and the bytes stored for it are compared with storing each call in full.

All three processes share this machine's cores, so the added latency includes
the gateway's CPU time competing with the client and engine, which is the
honest number for a one-machine set-up.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ADMIN = "bench-admin-token-0123456789"
OUTPUT_TOKENS = 16


# ---------------------------------------------------------------- fake engine


def _prompt_ids(messages: list[dict], cache: dict[bytes, list[int]]) -> list[int]:
    """Stand-in prompt ids: 20 per message, or one per 4 characters of a long
    one (an agent-sized prompt is as long as a real one), the same for the same
    message."""
    out: list[int] = []
    for message in messages:
        text = json.dumps(message, sort_keys=True).encode()
        digest = hashlib.sha256(text).digest()
        ids = cache.get(digest)
        if ids is None:
            n = max(20, len(text) // 4)
            seed = int.from_bytes(digest[:4], "little")
            ids = [1000 + (seed + i * 7919) % 60000 for i in range(n)]
            if len(cache) > 4096:
                cache.clear()
            cache[digest] = ids
        out.extend(ids)
    return out


def _completion_reply(body: dict, output_ids: list[int]) -> tuple[bytes, bool]:
    """vLLM's completions route with token ids in and out (token-in/token-out capture)."""
    prompt = len(body.get("prompt") or [])
    usage = {
        "prompt_tokens": prompt,
        "completion_tokens": len(output_ids),
        "total_tokens": prompt + len(output_ids),
    }
    head = {"id": "cmpl-x", "created": 1, "model": body.get("model", "m")}
    if not body.get("stream"):
        choice = {
            "index": 0,
            "text": "",
            "token_ids": output_ids,
            "logprobs": {"token_logprobs": [-0.5] * len(output_ids)},
            "finish_reason": "stop",
            "stop_reason": None,
        }
        doc = {**head, "object": "text_completion", "choices": [choice], "usage": usage}
        return json.dumps(doc).encode(), False
    chunks = [
        {
            **head,
            "object": "text_completion",
            "choices": [
                {
                    "index": 0,
                    "text": "",
                    "token_ids": [token],
                    "logprobs": {"token_logprobs": [-0.5]},
                    "finish_reason": "stop" if i == len(output_ids) - 1 else None,
                    "stop_reason": None,
                }
            ],
        }
        for i, token in enumerate(output_ids)
    ]
    chunks.append({**head, "object": "text_completion", "choices": [], "usage": usage})
    data = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    return data + b"data: [DONE]\n\n", True


def _engine_reply(
    path: str, body: dict, cache: dict[bytes, list[int]], output_ids: list[int]
) -> tuple[bytes, bool]:
    if path == "/v1/completions":
        return _completion_reply(body, output_ids)
    prompt = _prompt_ids(body.get("messages") or [], cache)
    ids = list(range(500, 500 + OUTPUT_TOKENS))
    head = {"id": "chatcmpl-x", "created": 1, "model": body.get("model", "m")}
    if not body.get("stream"):
        doc = {
            **head,
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": "w" * OUTPUT_TOKENS,
                        "reasoning": None,
                    },
                    "logprobs": {
                        "content": [
                            {"token": "w", "logprob": -0.5, "bytes": [119], "top_logprobs": []}
                            for _ in ids
                        ]
                    },
                    "finish_reason": "length",
                    "stop_reason": None,
                    "token_ids": ids,
                }
            ],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(ids),
                "total_tokens": len(prompt) + len(ids),
            },
            "prompt_token_ids": prompt,
        }
        return json.dumps(doc).encode(), False
    chunks = [
        {
            **head,
            "object": "chat.completion.chunk",
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
            "prompt_token_ids": prompt,
        }
    ]
    for i, token in enumerate(ids):
        choice = {
            "index": 0,
            "delta": {"content": "w"},
            "logprobs": {
                "content": [{"token": "w", "logprob": -0.5, "bytes": [119], "top_logprobs": []}]
            },
            "finish_reason": "length" if i == len(ids) - 1 else None,
            "token_ids": [token],
        }
        chunks.append({**head, "object": "chat.completion.chunk", "choices": [choice]})
    chunks.append(
        {
            **head,
            "object": "chat.completion.chunk",
            "choices": [],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(ids),
                "total_tokens": len(prompt) + len(ids),
            },
        }
    )
    data = (
        b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    )
    return data, True


def _output_ids() -> list[int]:
    """What the fake engine samples on the completions route: real Qwen3 ids
    (the gateway decodes them), 15 words and the end of the turn."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(ROOT / "src/polar/assets/qwen3-tokenizer/tokenizer.json"))
    words = tokenizer.encode(" w" * (OUTPUT_TOKENS - 1), add_special_tokens=False).ids
    return [*words[: OUTPUT_TOKENS - 1], tokenizer.token_to_id("<|im_end|>")]


async def _serve_engine(port: int) -> None:
    cache: dict[bytes, list[int]] = {}
    output_ids = _output_ids()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1].decode()
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = json.loads(await reader.readexactly(length)) if length else {}
                payload, stream = _engine_reply(path, body, cache, output_ids)
                if stream:
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                        b"transfer-encoding: chunked\r\n\r\n"
                        + f"{len(payload):x}\r\n".encode()
                        + payload
                        + b"\r\n0\r\n\r\n"
                    )
                else:
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                        + f"content-length: {len(payload)}\r\n\r\n".encode()
                        + payload
                    )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


# ---------------------------------------------------------------- client


class Connection:
    """A minimal keep-alive HTTP/1.1 client: the same cheap client for both targets."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(
        self, path: str, body: bytes, headers: dict[str, str]
    ) -> tuple[float, float, bytes]:
        """Returns (seconds to first body byte, seconds to the end, body)."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.reader is not None
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        start = time.perf_counter()
        self.writer.write(
            f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n{extra}\r\n".encode()
            + body
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        chunked = b"transfer-encoding: chunked" in head.lower()
        first = None
        out = bytearray()
        if chunked:
            while True:
                size = int((await self.reader.readuntil(b"\r\n"))[:-2], 16)
                if first is None:
                    first = time.perf_counter() - start
                if size == 0:
                    await self.reader.readuntil(b"\r\n")
                    break
                out += await self.reader.readexactly(size)
                await self.reader.readexactly(2)
        else:
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            data = await self.reader.readexactly(length)
            first = time.perf_counter() - start
            out += data
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {bytes(out)[:300]!r}")
        return first or 0.0, time.perf_counter() - start, bytes(out)


@dataclass
class Sample:
    ttfb: list[float]
    total: list[float]


async def _round(
    port: int, path: str, keys: list[str], calls: int, stream: bool, model: str, think_s: float
) -> Sample:
    sample = Sample([], [])
    messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "hi"},
    ]

    async def session(key: str) -> None:
        conn = Connection(port)
        body = json.dumps(
            {
                "model": model,
                "messages": messages,
                "stream": stream,
                "max_tokens": OUTPUT_TOKENS,
                "logprobs": True,
                "top_logprobs": 0,
                "return_token_ids": True,
                **({"stream_options": {"include_usage": True}} if stream else {}),
            }
        ).encode()
        if think_s:  # spread the sessions' first calls over one think period
            await asyncio.sleep(think_s * (hash(key) % 1000) / 1000)
        for _ in range(calls):
            ttfb, total, _ = await conn.post(path, body, {"authorization": f"Bearer {key}"})
            sample.ttfb.append(ttfb)
            sample.total.append(total)
            if think_s:
                await asyncio.sleep(think_s)
        assert conn.writer is not None
        conn.writer.close()

    await asyncio.gather(*(session(k) for k in keys))
    return sample


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


# ---------------------------------------------------------------- main


def _wait(
    url_port: int,
    path: str = "/health",
    timeout: float = 60,
    process: subprocess.Popen[bytes] | None = None,
) -> None:
    """Until the server on ``url_port`` answers ``path``; ``process``: the
    server's, so that one that exits during start-up (a bad flag, say) ends
    the wait at once, with its exit code, instead of after ``timeout``."""
    import urllib.request

    deadline = time.time() + timeout
    while time.time() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(
                f"{shlex.join(map(str, process.args))} exited with {process.returncode} "
                f"before serving on port {url_port}"
            )
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{url_port}{path}", timeout=1):
                return
        except Exception:
            time.sleep(0.1)
    raise TimeoutError(f"port {url_port} not ready")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _admin(port: int, method: str, path: str, body: dict | None = None) -> dict:
    import urllib.request

    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body or {}).encode() if method == "POST" else None,
        method=method,
        headers={"authorization": f"Bearer {ADMIN}", "content-type": "application/json"},
    )
    with urllib.request.urlopen(request) as reply:
        return json.loads(reply.read())


async def _long_session(gw_port: int, key: str, turns: int) -> None:
    conn = Connection(gw_port)
    messages: list[dict] = [{"role": "system", "content": "You are a coding agent. " * 200}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"step {turn}: " + "tool output line\n" * 40})
        body = json.dumps({"model": "m", "messages": messages, "stream": True}).encode()
        await conn.post("/v1/chat/completions", body, {"authorization": f"Bearer {key}"})
        messages.append({"role": "assistant", "content": "w" * OUTPUT_TOKENS})


COLUMNS = (
    f"{'load':<10}{'mode':<7}{'sessions':>9}{'calls':>7} | {'direct p50':>11}{'p99':>8} | "
    f"{'gateway p50':>12}{'p99':>8} | {'added p50':>10}{'p99':>8} | "
    f"{'ttfb direct':>12}{'gateway':>9}{'added':>8}"
)


def _row(load: str, stream: bool, level: int, direct: Sample, through: Sample) -> str:
    d50, d99 = _pct(direct.total, 0.5), _pct(direct.total, 0.99)
    g50, g99 = _pct(through.total, 0.5), _pct(through.total, 0.99)
    head = f"{load:<10}{'stream' if stream else 'whole':<7}{level:>9}{len(through.total):>7} | "
    times = (
        f"{d50:>9.2f}ms{d99:>6.2f}ms | {g50:>10.2f}ms{g99:>6.2f}ms | "
        f"{g50 - d50:>8.2f}ms{g99 - d99:>6.2f}ms | "
    )
    if not stream:
        return head + times + f"{'-':>12}{'-':>9}{'-':>8}"
    t_d, t_g = _pct(direct.ttfb, 0.5), _pct(through.ttfb, 0.5)
    return head + times + f"{t_d:>10.2f}ms{t_g:>7.2f}ms{t_g - t_d:>6.2f}ms"


def _measure(
    ports: tuple[int, int], keys: list[str], calls: int, stream: bool, think: float, rounds: int
) -> tuple[Sample, Sample]:
    """Alternate direct and gateway rounds so both see the same machine noise."""
    direct, through = Sample([], []), Sample([], [])
    for _ in range(rounds):
        for port, sample in zip(ports, (direct, through), strict=True):
            got = asyncio.run(_round(port, "/v1/chat/completions", keys, calls, stream, "m", think))
            sample.ttfb += got.ttfb
            sample.total += got.total
    return direct, through


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--calls", type=int, default=512, help="calls per level per round, saturated runs"
    )
    parser.add_argument(
        "--think-ms",
        type=float,
        default=1000,
        help="pause between a session's calls in the paced runs (an agent running tools)",
    )
    parser.add_argument("--levels", default="1,64,256", help="concurrent sessions")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per target")
    parser.add_argument("--turns", type=int, default=64, help="turns of the long session")
    parser.add_argument(
        "--synchronous",
        choices=["full", "normal"],
        default="normal",
        help="the gateway's SQLite durability (default: normal, its own default)",
    )
    parser.add_argument(
        "--scale",
        action="store_true",
        help="instead: memory per session and CPU per call (benchmarks/gateway_scale.py)",
    )
    parser.add_argument(
        "--baseline", type=Path, help="--scale: a Polar source tree to compare with (has src/)"
    )
    parser.add_argument("--memory-rounds", type=int, default=10, help="--scale: rounds of 16")
    parser.add_argument(
        "--baseline-memory-rounds",
        type=int,
        default=3,
        help="--scale: rounds for the baseline (-1: no memory figures for it)",
    )
    parser.add_argument(
        "--captures",
        default="engine_rendered,token_in_token_out",
        help="--scale: capture modes to measure",
    )
    parser.add_argument("--parts", default="cpu,memory", help="--scale: what to measure")
    parser.add_argument(
        "--sizes", default="small,agent", help="--scale: request sizes for the CPU figures"
    )
    parser.add_argument(
        "--litellm",
        type=Path,
        help="--scale: LiteLLM's litellm executable to measure beside engine-rendered capture "
        "(default: .cache/venv-litellm, from scripts/setup --litellm, or litellm on PATH; "
        "off: not measured)",
    )
    parser.add_argument(
        "--batches",
        type=int,
        default=5,
        help="--scale: CPU batches per figure, alternating between the gateways (median)",
    )
    parser.add_argument(
        "--gateway-config", type=Path, help="--scale: YAML config for this tree's gateway"
    )
    parser.add_argument(
        "--workers",
        help="instead: throughput of these worker counts (e.g. 1,2) and the router's hop",
    )
    parser.add_argument("--sessions", type=int, default=32, help="--workers: sessions at once")
    parser.add_argument(
        "--session-calls", type=int, default=8, help="--workers: calls per session per round"
    )
    parser.add_argument("--serve-engine", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_engine:
        asyncio.run(_serve_engine(args.serve_engine))
        return
    if args.workers:
        import gateway_workers

        counts = [int(n) for n in args.workers.split(",")]
        gateway_workers.main(counts, args.sessions, args.session_calls, args.rounds)
        return
    if args.scale:
        import gateway_scale

        gateway_scale.main(
            args.baseline,
            args.memory_rounds,
            args.baseline_memory_rounds,
            args.captures.split(","),
            args.parts.split(","),
            args.gateway_config,
            args.batches,
            args.litellm,
            args.sizes.split(","),
        )
        return
    levels = [int(x) for x in args.levels.split(",")]

    engine_port, gw_port = _free_port(), _free_port()
    workdir = Path(tempfile.mkdtemp(prefix="polar-bench-"))
    engine = subprocess.Popen([sys.executable, __file__, "--serve-engine", str(engine_port)])
    gateway = subprocess.Popen(
        [
            sys.executable, "-m", "polar", "gateway", "--port", str(gw_port),
            "--admin-token", ADMIN, "--engine-url", f"http://127.0.0.1:{engine_port}",
            "--engine-model", "m", "--store", str(workdir / "records.db"),
            "--store-synchronous", args.synchronous, "--log-level", "error",
        ],
        cwd=ROOT,
    )  # fmt: skip
    try:
        _wait(gw_port, process=gateway)
        keys = [_admin(gw_port, "POST", "/admin/sessions")["api_key"] for _ in range(max(levels))]
        print(
            f"cores={os.cpu_count()}, {OUTPUT_TOKENS} output tokens per call, "
            f"store synchronous={args.synchronous}; saturated: sessions call back to back; "
            f"paced: each session waits {args.think_ms:g} ms between calls"
        )
        print(COLUMNS)
        for think in (0.0, args.think_ms / 1000):
            for stream in (False, True):
                for level in levels:
                    calls = 3 if think else max(2, args.calls // level)
                    direct, through = _measure(
                        (engine_port, gw_port), keys[:level], calls, stream, think, args.rounds
                    )
                    print(_row("paced" if think else "saturated", stream, level, direct, through))
        created = _admin(gw_port, "POST", "/admin/sessions")
        asyncio.run(_long_session(gw_port, created["api_key"], args.turns))
        stats = _admin(gw_port, "GET", f"/admin/sessions/{created['session_id']}/stats")
        print(
            f"\nbytes stored for one {args.turns}-turn session: {stats['stored_bytes']:,} "
            f"(storing every call in full: {stats['naive_bytes']:,}; "
            f"{stats['naive_bytes'] / stats['stored_bytes']:.1f}x smaller)"
        )
    finally:
        gateway.terminate()
        engine.terminate()
        gateway.wait(10)
        engine.wait(10)


if __name__ == "__main__":
    main()
