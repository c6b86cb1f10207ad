"""Pieces of ``benchmarks/reliability.py``: a misbehaving vLLM, a request
mutator, and helpers to run gateway and engine processes."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import orjson

from polar.ir import Dialect

# ---------------------------------------------------------------- engine faults

FAULTS = ("http500", "http503", "reset", "stall", "truncated", "shape", "bad_ids")
TOKENIZE_FAULTS = ("tokenize_500", "tokenize_503", "tokenize_reset", "tokenize_stall")
"""Faults of the count engine-rendered capture asks before a call (``POST /tokenize``)."""
MODELS_FAULTS = ("models_stall", "models_500", "models_reset", "models_no_length")
"""Faults of ``GET /v1/models`` (a gateway without ``engine.max_model_len`` asks it)."""
STALL_S = 2.0
PROMPT = [10, 11, 12, 13]
OUTPUT = [(21, "he"), (22, "llo"), (23, " there")]


def chat_reply(bad_ids: bool, tag: str = "") -> bytes:
    ids = [-1 if bad_ids else i for i, _ in OUTPUT]
    return orjson.dumps(
        {
            "prompt_token_ids": PROMPT,
            "choices": [
                {
                    "message": {"role": "assistant", "content": tag + "hello there"},
                    "token_ids": ids,
                    "logprobs": {"content": [{"token": t, "logprob": -0.5} for _, t in OUTPUT]},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": len(PROMPT), "completion_tokens": len(OUTPUT)},
        }
    )


def sse_chunks(bad_ids: bool, tag: str = "") -> list[bytes]:
    out = [orjson.dumps({"prompt_token_ids": PROMPT, "choices": []})]
    for n, (i, text) in enumerate(OUTPUT):
        text = tag + text if n == 0 else text
        lp = {"content": [{"token": text, "logprob": -0.5}]}
        choice = {"delta": {"content": text}, "token_ids": [-1 if bad_ids else i], "logprobs": lp}
        out.append(orjson.dumps({"choices": [choice]}))
    out.append(orjson.dumps({"choices": [{"delta": {}, "finish_reason": "stop"}]}))
    return [b"data: " + c + b"\n\n" for c in out] + [b"data: [DONE]\n\n"]


class FaultyVllm:
    """Answers ``/v1/chat/completions``, ``/tokenize`` and ``GET /v1/models`` as vLLM
    does, failing ``rate`` of chat and tokenize replies (seeded) and every
    ``/v1/models`` reply as ``models_fault`` says. ``faults`` notes, per request
    id (``session/seq.attempt``), the route (``chat``, ``tokenize``) and fault
    (``None``: none) of each of its requests, in order."""

    def __init__(
        self,
        rate: float,
        seed: int,
        token_delay_s: float = 0.0,
        *,
        tokenize_rate: float = 0.0,
        models_fault: str | None = None,
    ) -> None:
        self.rng = random.Random(seed)
        self.rate = rate
        self.tokenize_rate = tokenize_rate
        self.models_fault = models_fault
        self.models_asked = 0
        self.token_delay_s = token_delay_s
        self.seen: set[str] = set()
        self.faults: dict[str, list[tuple[str, str | None]]] = {}
        self.version = 0
        """The weights' version, named at the start of every reply (``v3 ``)."""
        self.injected: dict[str, int] = {}
        self.lock = threading.Lock()
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                with engine.lock:
                    engine.models_asked += 1
                engine.models(self)

            def do_POST(self) -> None:
                body = orjson.loads(self.rfile.read(int(self.headers["content-length"])))
                tokenize = self.path == "/tokenize"
                kinds, chance = (
                    (TOKENIZE_FAULTS, engine.tokenize_rate) if tokenize else (FAULTS, rate)
                )
                request_id = self.headers.get("x-request-id", "?")
                with engine.lock:
                    engine.seen.add(request_id)
                    fault = engine.rng.choice(kinds) if engine.rng.random() < chance else None
                    route = "tokenize" if tokenize else "chat"
                    engine.faults.setdefault(request_id, []).append((route, fault))
                    if fault:
                        engine.injected[fault] = engine.injected.get(fault, 0) + 1
                if tokenize:
                    engine.count(self, fault)
                else:
                    engine.answer(self, bool(body.get("stream")), fault)

            def log_message(self, format: str, *args: object) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: object, client_address: object) -> None:
                pass

        self.server = Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def count(self, h: BaseHTTPRequestHandler, fault: str | None) -> None:
        """vLLM's ``/tokenize`` reply (a count), or ``fault``."""
        if fault == "tokenize_reset":
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)
            return
        if fault == "tokenize_stall":
            time.sleep(STALL_S)
        status = {"tokenize_500": 500, "tokenize_503": 503}.get(fault or "", 200)
        payload = (
            b'{"count": 4}' if status == 200 else b'{"error": {"message": "injected failure"}}'
        )
        _send(h, status, payload)

    def models(self, h: BaseHTTPRequestHandler) -> None:
        """``GET /v1/models`` as :attr:`models_fault` says (none: a length)."""
        fault = self.models_fault
        if fault == "models_reset":
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)
            return
        if fault == "models_stall":
            time.sleep(30.0)
        if fault == "models_500":
            _send(h, 500, b'{"error": {"message": "injected failure"}}')
            return
        entry: dict[str, object] = {"id": "m"}
        if fault != "models_no_length":
            entry["max_model_len"] = 4096
        _send(h, 200, orjson.dumps({"object": "list", "data": [entry]}))

    def answer(self, h: BaseHTTPRequestHandler, stream: bool, fault: str | None) -> None:
        if fault == "reset":
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)
            return
        if fault == "stall":
            time.sleep(STALL_S)
        if fault in ("http500", "http503"):
            payload = b'{"error": {"message": "injected failure"}}'
            h.send_response(500 if fault == "http500" else 503)
            h.send_header("content-type", "application/json")
            h.send_header("content-length", str(len(payload)))
            h.end_headers()
            h.wfile.write(payload)
            return
        bad = fault == "bad_ids"
        if not stream:
            payload = b"[]" if fault == "shape" else chat_reply(bad, f"v{self.version} ")
            h.send_response(200)
            h.send_header("content-type", "application/json")
            h.send_header("content-length", str(len(payload)))
            h.end_headers()
            if fault == "truncated":
                h.wfile.write(payload[: len(payload) // 2])
                h.close_connection = True
                h.connection.shutdown(socket.SHUT_RDWR)
                return
            h.wfile.write(payload)
            return
        chunks = [b"data: []\n\n"] if fault == "shape" else sse_chunks(bad, f"v{self.version} ")
        h.send_response(200)
        h.send_header("content-type", "text/event-stream")
        h.send_header("transfer-encoding", "chunked")
        h.end_headers()
        for i, chunk in enumerate(chunks):
            if fault == "truncated" and i == 3:  # after two tokens
                h.close_connection = True
                h.connection.shutdown(socket.SHUT_RDWR)
                return
            h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            h.wfile.flush()
            time.sleep(self.token_delay_s)
        h.wfile.write(b"0\r\n\r\n")

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _send(h: BaseHTTPRequestHandler, status: int, payload: bytes) -> None:
    h.send_response(status)
    h.send_header("content-type", "application/json")
    h.send_header("content-length", str(len(payload)))
    h.end_headers()
    h.wfile.write(payload)


DIALECTS = {
    Dialect.OPENAI_CHAT: ("/v1/chat/completions", "messages"),
    Dialect.ANTHROPIC_MESSAGES: ("/v1/messages", "messages"),
    Dialect.OPENAI_RESPONSES: ("/v1/responses", "input"),
}


def call_once(client: httpx.Client, dialect: Dialect, stream: bool) -> str:
    """One call; returns ``ok``, ``error <status>`` or ``stream-error``, or raises."""
    path, field = DIALECTS[dialect]
    body: dict[str, object] = {"model": "m", field: [{"role": "user", "content": "hi"}]}
    body["stream"] = stream
    if dialect is Dialect.ANTHROPIC_MESSAGES:
        body["max_tokens"] = 16
    with client.stream("POST", path, json=body) as reply:
        raw = reply.read()
    if reply.status_code != 200:
        doc = orjson.loads(raw)
        shaped = (
            doc.get("type") == "error" and isinstance(doc["error"]["message"], str)
            if dialect is Dialect.ANTHROPIC_MESSAGES
            else set(doc) == {"error"} and isinstance(doc["error"]["message"], str)
        )
        if not shaped or reply.status_code < 500:
            raise AssertionError(
                f"{dialect.value}: bad error reply {reply.status_code} {raw[:200]!r}"
            )
        return f"error {reply.status_code}"
    if not stream:
        return "ok"
    text = raw.decode()
    if dialect is Dialect.OPENAI_CHAT:
        if 'data: {"error"' in text:  # an error event after the stream had begun
            return "stream-error"
        finished = text.rstrip().endswith("data: [DONE]")
    elif dialect is Dialect.ANTHROPIC_MESSAGES:
        if "event: error" in text:
            return "stream-error"
        finished = "event: message_stop" in text
    else:
        if "event: error" in text or "event: response.failed" in text:
            return "stream-error"
        finished = "event: response.completed" in text
    if not finished:
        raise AssertionError(f"{dialect.value}: stream ended without finishing: {text[-300:]!r}")
    return "ok"


# ---------------------------------------------------------------- fuzz

ODD: list[object] = [None, True, 0, -1, 2**63, 1e308, "", "\u0000", [], {}, {"type": "hologram"}]
DEEP = "<deep>"


def paths_of(value: object, path: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    out: list[tuple[object, ...]] = []
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, child in items:
        out.append((*path, key))
        out.extend(paths_of(child, (*path, key)))
    return out


def mutant(base: dict[str, object], rng: random.Random) -> bytes:
    body = orjson.loads(orjson.dumps(base))
    roll = rng.random()
    depth = 0
    for _ in range(rng.randint(1, 3)):
        paths = paths_of(body)
        if not paths:
            break
        path = rng.choice(paths)
        parent = body
        for step in path[:-1]:
            parent = parent[step]  # type: ignore[index]
        key = path[-1]
        choice = rng.random()
        if choice < 0.3:
            del parent[key]  # type: ignore[attr-defined]
        elif choice < 0.4:
            depth = rng.choice([70, 256, 300, 990, 1000])
            parent[key] = DEEP  # type: ignore[index]
        elif choice < 0.45:
            parent[key] = "z" * rng.choice([5_000, 300_000, 1_000_000])  # type: ignore[index]
        else:
            parent[key] = rng.choice(ODD)  # type: ignore[index]
    raw = orjson.dumps(body)
    if depth:
        raw = raw.replace(orjson.dumps(DEEP), b"[" * depth + b"]" * depth, 1)
    if roll < 0.04:
        return raw[: rng.randrange(len(raw))]
    if roll < 0.06:
        return raw.replace(b'"', b"\xff", 1)
    return raw


def wait_for(url: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(url)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise SystemExit(f"{url} did not come up")


def rss_of(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


# ---------------------------------------------------------------- kill the gateway


def start_gateway(
    port: int,
    engine_url: str,
    store: Path,
    token: str,
    extra: tuple[str, ...] = (),
    log: Path | None = None,
) -> subprocess.Popen[bytes]:
    """A ``polar gateway`` process (``extra``: more of its options; its output to
    ``log``, else dropped), once it answers."""
    command = [
        sys.executable, "-m", "polar", "gateway", "--port", str(port), "--admin-token", token,
        "--engine-url", engine_url, "--engine-model", "m", "--store", str(store), *extra,
    ]  # fmt: skip
    out = log.open("ab") if log is not None else subprocess.DEVNULL
    proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("the gateway did not start")


# ---------------------------------------------------------------- big prompts


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0
