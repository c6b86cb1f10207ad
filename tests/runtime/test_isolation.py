"""What a sandboxed session cannot do: read or write the host's files outside its
session directory, or open a connection to anything but the gateway.

Each check runs against the bubblewrap sandbox and a podman (or docker)
container, with real files planted on the host, real TCP listeners on the
host's loopback and non-loopback addresses, and a real HTTP server standing
in for the gateway. Where a check could pass for the wrong reason (a probe
that never connects anywhere), the same probe is first shown to succeed
from plain host processes.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from polar.runtime import GatewayAddress, Mount

from support.hostnet import PROBE, HostGateway, Listener, host_ip
from support.runtimes import ISOLATED_KINDS, Runtimes, SpecMaker, spec_maker

pytestmark = pytest.mark.anyio

FETCH = """
import sys, urllib.request
body = ("x" * int(sys.argv[2])).encode() if len(sys.argv) > 2 else None
request = urllib.request.Request(sys.argv[1], data=body)
with urllib.request.urlopen(request, timeout=30) as response:
    for line in response:
        print(line.decode().rstrip("\\n"), flush=True)
"""
"""``python3 -c FETCH URL [N]``: prints the response line by line as it arrives (with
``N``, a POST of N bytes ``x``)."""


@pytest.fixture(params=ISOLATED_KINDS)
def make_spec(request: pytest.FixtureRequest) -> SpecMaker:
    return spec_maker(request.param, request)


@pytest.fixture
def gateway() -> Iterator[HostGateway]:
    with HostGateway() as server:
        yield server


@pytest.fixture
def listeners() -> Iterator[list[Listener]]:
    """TCP listeners on the host's loopback and (where there is one) non-loopback address."""
    hosts = ["127.0.0.1"]
    address = host_ip()
    if address is None:
        pytest.skip("this host has no non-loopback IPv4 address to listen on")
    hosts.append(address)
    with Listener(hosts[0]) as loopback, Listener(hosts[1]) as external:
        yield [loopback, external]


@pytest.fixture
def planted(tmp_path: Path) -> Iterator[list[Path]]:
    """Secret files outside any session: one beside the sessions, one in the home."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    secrets = [elsewhere / "secret.txt", Path.home() / f".polar-test-secret-{uuid.uuid4().hex}"]
    for path in secrets:
        path.write_text("the host's secret\n")
    yield secrets
    secrets[1].unlink()


async def test_a_command_cannot_read_host_files_outside_its_session(
    runtimes: Runtimes, make_spec: SpecMaker, planted: list[Path]
) -> None:
    host = await runtimes.start(SpecMaker("plain")())
    runtime = await runtimes.start(make_spec())
    argv = ["sh", "-c", 'for f in "$@"; do cat "$f" || echo "cannot read $f"; done', "sh"]

    on_host = await host.exec([*argv, *map(str, planted)])
    inside = await runtime.exec([*argv, *map(str, planted), str(Path.home())])

    assert on_host.stdout.count("the host's secret") == len(planted)
    assert "the host's secret" not in inside.stdout
    assert inside.stdout.count("cannot read") == len(planted) + 1


async def test_a_command_cannot_write_outside_its_session(
    runtimes: Runtimes, make_spec: SpecMaker, planted: list[Path], tmp_path: Path
) -> None:
    runtime = await runtimes.start(make_spec())
    token = uuid.uuid4().hex
    targets = [
        planted[0].parent / "written.txt",  # beside the session, on the host
        planted[0],  # overwrite a host file
        Path("/tmp") / f"polar-test-{token}",  # the host's /tmp
        Path.home() / f".polar-test-{token}",
        Path("/usr") / f"polar-test-{token}",
        Path("/etc") / f"polar-test-{token}",
    ]
    script = 'for f in "$@"; do echo changed > "$f" && echo "wrote $f"; done; echo done > ok.txt'

    result = await runtime.exec(["sh", "-c", script, "sh", *map(str, targets)])

    assert (runtime.session_dir / "workspace" / "ok.txt").read_text() == "done\n"
    assert planted[0].read_text() == "the host's secret\n"
    assert [path for path in targets if path != planted[0] and path.exists()] == []
    # the sandbox's own /tmp (and a container's whole root) may be writable,
    # but the host's directories beside the session are not even there
    assert f"wrote {targets[0]}" not in result.stdout
    assert f"wrote {targets[1]}" not in result.stdout


async def test_read_only_mounts_can_be_read_but_not_written(
    runtimes: Runtimes, make_spec: SpecMaker, tmp_path: Path
) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "tool.txt").write_text("a tool\n")
    runtime = await runtimes.start(make_spec(mounts=[Mount(path=tools)]))

    read = await runtime.exec(["cat", str(tools / "tool.txt")])
    write = await runtime.exec(["sh", "-c", f"echo x > {tools}/new.txt"])

    assert read.stdout == "a tool\n"
    assert not write.ok and not (tools / "new.txt").exists()


async def test_the_network_reaches_the_gateway_and_nothing_else(
    runtimes: Runtimes,
    make_spec: SpecMaker,
    gateway: HostGateway,
    listeners: list[Listener],
) -> None:
    address = GatewayAddress("127.0.0.1", gateway.port)
    host = await runtimes.start(SpecMaker("plain")())
    runtime = await runtimes.start(make_spec(network="gateway_only"), address)
    targets = [listener.target for listener in listeners] + [f"127.0.0.1:{gateway.port}"]

    on_host = await host.exec(["python3", "-c", PROBE, *targets[:2]])
    accepted_from_host = [listener.accepted for listener in listeners]
    inside = await runtime.exec(["python3", "-c", PROBE, *targets])
    fetched = await runtime.exec(["python3", "-c", FETCH, f"{runtime.gateway_url}/v1/models"])

    assert on_host.stdout.count("connected") == 2 and accepted_from_host == [1, 1]
    assert inside.stdout.count("failed") == len(targets), inside.stdout + inside.stderr
    assert [listener.accepted for listener in listeners] == [1, 1]
    assert runtime.gateway_url is not None and runtime.gateway_url.startswith("http://127.0.0.1:")
    assert json.loads(fetched.stdout) == {"hello": "from the host", "path": "/v1/models"}
    assert gateway.requests == [("GET", "/v1/models")]


async def test_the_gateway_relay_streams_responses_and_carries_request_bodies(
    runtimes: Runtimes, make_spec: SpecMaker, gateway: HostGateway
) -> None:
    runtime = await runtimes.start(
        make_spec(network="gateway_only"), GatewayAddress("127.0.0.1", gateway.port)
    )
    lines: list[str] = []

    def on_output(stream: str, line: str) -> None:
        lines.append(line)
        if line == "data: first\n":
            gateway.release.set()  # the second chunk is only sent once the first arrived

    streamed = await runtime.exec(
        ["python3", "-c", FETCH, f"{runtime.gateway_url}/v1/responses", "0"], on_output=on_output
    )
    size = 3_000_000
    echoed = await runtime.exec(
        ["python3", "-c", FETCH, f"{runtime.gateway_url}/v1/chat/completions", str(size)]
    )

    assert streamed.ok, streamed.stderr
    assert [line for line in lines if line.strip()] == ["data: first\n", "data: second\n"]
    assert json.loads(echoed.stdout) == {"echo": "x" * size}


async def test_network_none_has_no_gateway_and_no_way_out(
    runtimes: Runtimes, make_spec: SpecMaker, gateway: HostGateway
) -> None:
    runtime = await runtimes.start(
        make_spec(network="none"), GatewayAddress("127.0.0.1", gateway.port)
    )

    probe = await runtime.exec(["python3", "-c", PROBE, f"127.0.0.1:{gateway.port}"])

    assert runtime.gateway_url is None
    assert "failed" in probe.stdout and gateway.requests == []


async def test_network_host_shares_the_hosts_network(
    runtimes: Runtimes, make_spec: SpecMaker, gateway: HostGateway
) -> None:
    address = GatewayAddress("127.0.0.1", gateway.port)
    runtime = await runtimes.start(make_spec(network="host"), address)

    fetched = await runtime.exec(["python3", "-c", FETCH, f"{runtime.gateway_url}/v1/models"])

    assert runtime.gateway_url == f"http://127.0.0.1:{gateway.port}"
    assert json.loads(fetched.stdout)["hello"] == "from the host"


async def test_sessions_do_not_see_each_other(runtimes: Runtimes, make_spec: SpecMaker) -> None:
    first = await runtimes.start(make_spec())
    second = await runtimes.start(make_spec())
    await first.exec(["sh", "-c", "echo mine > note.txt"])
    sleeper = asyncio.ensure_future(first.exec(["sleep", "30"]))

    read = await second.exec(["cat", f"{first.workdir}/note.txt"])
    processes = await second.exec(["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"])
    await first.cancel()
    await sleeper

    assert not read.ok
    assert "sleep 30" not in processes.stdout


RAW = """
import json, socket, sys
port = int(sys.argv[1])
for request in json.loads(sys.argv[2]):
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(request.encode())
        conn.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    print(json.dumps(answer.split(b"\\r\\n", 1)[0].decode(errors="replace")))
"""
"""``python3 -c RAW PORT JSON_LIST``: sends each raw request on its own connection,
prints each answer's status line (a JSON string per line)."""


GEMINI = "/v1beta/models/gemini-3.8-flash:streamGenerateContent"


def _raw(method: str, path: str, key: str | None, extra: str = "", body: str = "") -> str:
    auth = f"authorization: Bearer {key}\r\n" if key is not None else ""
    length = f"content-length: {len(body)}\r\n" if body and "transfer-encoding" not in extra else ""
    return f"{method} {path} HTTP/1.1\r\nhost: x\r\n{auth}{length}{extra}\r\n{body}"


async def test_the_relay_passes_only_model_calls_with_the_sessions_key(
    runtimes: Runtimes, make_spec: SpecMaker, gateway: HostGateway
) -> None:
    """What an agent would try through the relay to reach the control plane behind the
    gateway's port: admin and node routes, paths spelled another way, another key,
    no key, a request smuggled in a body, a protocol upgrade. The relay answers every
    one itself; the gateway (a stand-in recording what reaches it) sees only the
    model call that carries the session's key."""
    key = "sk-polar-this-session"
    runtime = await runtimes.start(
        make_spec(network="gateway_only"), GatewayAddress("127.0.0.1", gateway.port, api_key=key)
    )
    assert runtime.gateway_url is not None
    port = runtime.gateway_url.rsplit(":", 1)[1]
    smuggled = _raw("GET", "/admin/sessions", key)
    attempts = {
        "admin": _raw("GET", "/admin/sessions", key),
        "node api": _raw("GET", "/node/sessions", key),
        "node dispatch": _raw("POST", "/node/sessions", key, body="{}"),
        "dot segments": _raw("GET", "/v1/models/../../admin/sessions", key),
        "double slash": _raw("GET", "//admin/sessions", key),
        "encoded path": _raw("GET", "/v1/%2e%2e/admin/sessions", key),
        "absolute form": _raw("GET", "http://127.0.0.1/admin/sessions", key),
        "another key": _raw("GET", "/v1/models", "sk-polar-another-session"),
        "no key": _raw("GET", "/v1/models", None),
        "two keys": _raw("GET", "/v1/models", key, extra="x-api-key: sk-other\r\n"),
        "smuggled (CL+TE)": _raw(
            "POST",
            "/v1/chat/completions",
            key,
            extra="content-length: 5\r\ntransfer-encoding: chunked\r\n",
            body=f"0\r\n\r\n{smuggled}",
        ),
        "upgrade": _raw("GET", "/v1/models", key, extra="connection: upgrade\r\nupgrade: h2c\r\n"),
        "not http": "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
        "gemini, another key in the query": _raw(
            "POST", f"{GEMINI}?key=sk-polar-another-session", None, body="{}"
        ),
        "gemini, a second key in the query": _raw(
            "POST", f"{GEMINI}?key=sk-other", None, extra=f"x-goog-api-key: {key}\r\n", body="{}"
        ),
        "gemini, another goog key": _raw(
            "POST", GEMINI, None, extra="x-goog-api-key: sk-other\r\n", body="{}"
        ),
        "gemini, no key": _raw("POST", GEMINI, None, body="{}"),
        "gemini, a path for a model": _raw(
            "POST", "/v1beta/models/../../admin:generateContent", key, body="{}"
        ),
        "gemini, another method": _raw("POST", "/v1beta/models/m:embedContent", key, body="{}"),
        "gemini, a GET": _raw("GET", GEMINI, key),
        "the model call": _raw("GET", "/v1/models", key),
        "the gemini call": _raw(
            "POST", f"{GEMINI}?alt=sse", None, extra=f"x-goog-api-key: {key}\r\n", body="{}"
        ),
        "the gemini call, key in the query": _raw("POST", f"{GEMINI}?key={key}", None, body="{}"),
    }
    result = await runtime.exec(["python3", "-c", RAW, port, json.dumps(list(attempts.values()))])

    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert result.ok and len(lines) == len(attempts), result.stdout + result.stderr
    statuses = dict(zip(attempts, lines, strict=True))
    for call in ("the model call", "the gemini call", "the gemini call, key in the query"):
        assert statuses.pop(call).startswith("HTTP/1.1 200"), (call, statuses)
    passed = {name for name, line in statuses.items() if line[9:10] not in ("4", "5", "")}
    assert passed == set(), statuses
    assert gateway.requests == [
        ("GET", "/v1/models"),
        ("POST", f"{GEMINI}?alt=sse"),
        ("POST", f"{GEMINI}?key={key}"),
    ]
