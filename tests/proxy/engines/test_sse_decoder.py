"""Server-sent events are read the same however the network cuts the stream."""

from __future__ import annotations

import random

from polar.proxy.engines.transport import SSEDecoder, SSEEvent


def _reference(raw: bytes) -> list[SSEEvent]:
    """The WHATWG framing rules the decoder keeps, applied to the whole stream at
    once, one line at a time (the text after the last line break is not a line)."""
    events: list[SSEEvent] = []
    event: str | None = None
    data: list[bytes] = []
    lines = raw.split(b"\n")[:-1]
    for line in lines:
        line = line.removesuffix(b"\r")
        if line == b"":
            if data:
                events.append(SSEEvent(event, b"\n".join(data)))
            event, data = None, []
            continue
        if line.startswith(b":"):
            continue
        if b":" in line:
            name, value = line.split(b":", 1)
            value = value.removeprefix(b" ")
        else:
            name, value = line, b""
        if name == b"data":
            data.append(value)
        elif name == b"event":
            event = value.decode("utf-8", "replace")
    return events


def _stream(rng: random.Random) -> bytes:
    """Events as engines send them (one ``data:`` line, JSON or ``[DONE]``) among
    what the format also allows: several data lines, named events, comments,
    ``id:``/``retry:`` fields, fields without a colon or a space, CRLF."""
    out = []
    for _ in range(rng.randrange(0, 14)):
        newline = b"\r\n" if rng.random() < 0.2 else b"\n"
        lines = []
        if rng.random() < 0.2:
            lines.append(rng.choice([b": keep-alive", b":", b"id: 7", b"retry: 10"]))
        if rng.random() < 0.2:
            lines.append(rng.choice([b"event: error", b"event:ping", b"event"]))
        for _ in range(rng.choice([0, 1, 1, 1, 2, 3])):
            payload = rng.choice([b'{"a": [1, 2]}', b"[DONE]", b"", b" x", "é:".encode()])
            lines.append(rng.choice([b"data: ", b"data:", b"data"]) + payload)
        out.append(newline.join(lines) + newline + newline)
    if rng.random() < 0.3:
        out.append(b"data: unterminated")
    return b"".join(out)


def _check(seed: int) -> None:
    rng = random.Random(seed)
    raw = _stream(rng)
    cuts = sorted(rng.randrange(0, len(raw) + 1) for _ in range(rng.randrange(0, 6)))
    decoder = SSEDecoder()
    got: list[SSEEvent] = []
    start = 0
    for cut in [*cuts, len(raw)]:
        got += decoder.feed(raw[start:cut])
        start = cut
    assert got == _reference(raw), f"seed {seed}: {raw!r} cut at {cuts}"
    # Closing dispatches an event the server never ended with a blank line.
    rest = decoder.close()
    assert got + rest == _reference(raw + b"\n\n"), f"seed {seed}: close of {raw!r}"


def test_events_do_not_depend_on_where_the_stream_was_cut() -> None:
    for seed in range(500):
        _check(seed)


def test_a_burst_of_steps_comes_out_as_its_events_in_order() -> None:
    burst = b"".join(b'data: {"i": %d}\n\n' % i for i in range(8)) + b'data: {"i": 8'
    decoder = SSEDecoder()
    assert [e.data for e in decoder.feed(burst)] == [b'{"i": %d}' % i for i in range(8)]
    assert decoder.feed(b"}\n\ndata: [DONE]\n\n") == [
        SSEEvent(None, b'{"i": 8}'),
        SSEEvent(None, b"[DONE]"),
    ]
