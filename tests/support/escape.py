"""The escape agent: a program an adversarial agent could run in its sandbox,
trying every way out it knows, for the escape suite (``tests/rollout/test_escape.py``).

It runs as the ``shell`` harness's command inside a real session of a real
node. ``python3 escape.py probe '<json targets>'`` tries each way out and
prints one JSON object, ``{attempt: outcome}``, on its last stdout line (the
node keeps the agent's output tail in the session result). An outcome that
starts with ``ok`` means the attempt *worked*. The other modes push a limit:
``pids``, ``memory``, ``tmp``, ``disk``, each printing what it got before the
node stopped it. ``read '<json {name: path}>'`` only tries the reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from polar.tasks.model import DirectoryWorkspace, EvaluatorSpec, Task

ESCAPE = r"""
import hashlib, json, os, socket, subprocess, sys, time, urllib.request

def http(url, method="GET", key=None, body=None):
    headers = {"content-type": "application/json"}
    if key:
        headers["authorization"] = "Bearer " + key
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return f"ok {reply.status}"
    except urllib.error.HTTPError as exc:
        return f"refused {exc.code}"
    except Exception as exc:
        return f"failed {type(exc).__name__}"

def connect(host, port):
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
        return "ok connected"
    except OSError as exc:
        return f"failed errno {exc.errno}"

def read(path):
    try:
        if os.path.isdir(path):
            entries = sorted(os.listdir(path))
            return "ok listed " + ",".join(entries[:5]) if entries else "failed empty"
        with open(path, "rb") as handle:
            data = handle.read()
        return f"ok read {len(data)} bytes sha256 {hashlib.sha256(data).hexdigest()}"
    except OSError as exc:
        return f"failed errno {exc.errno}"

def write(path):
    try:
        with open(path, "w") as handle:
            handle.write("escaped\n")
        return "ok written"
    except OSError as exc:
        return f"failed errno {exc.errno}"

mode = sys.argv[1]
if mode == "probe":
    t = json.loads(sys.argv[2])
    relay = os.environ["ANTHROPIC_BASE_URL"].rstrip("/")
    key = os.environ["OPENAI_API_KEY"]
    token = t["token"]
    out = {}
    for name, url in (("node api", t["node"]), ("server api", t["server"]),
                      ("gateway port", t["gateway"])):
        out[f"{name} directly"] = http(url + "/health")
    for path in ("/node/sessions", "/node/health", "/tasks", "/nodes", "/admin/sessions",
                 "/health", "/metrics"):
        out[f"relay GET {path} (session key)"] = http(relay + path, key=key)
        out[f"relay GET {path} (control token)"] = http(relay + path, key=token)
    out["relay POST /node/sessions"] = http(relay + "/node/sessions", "POST", token, b"{}")
    out["relay POST /tasks"] = http(relay + "/tasks", "POST", token, b"{}")
    out["relay model call, another key"] = http(relay + "/v1/models", key="sk-polar-guess")
    out["relay model call, own key"] = http(relay + "/v1/models", key=key)
    out["loopback listener"] = connect("127.0.0.1", t["listener"])
    out["host address listener"] = connect(t["host_ip"], t["listener_external"]) \
        if t["host_ip"] else "failed no address"
    for name, path in t["reads"].items():
        out[f"read {name}"] = read(path)
    for name, path in t["writes"].items():
        out[f"write {name}"] = write(path)
    host_procs = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "pytest" in cmd and "escape.py" not in cmd:
                host_procs.append(pid)
    out["see host processes in /proc"] = "ok " + ",".join(host_procs) if host_procs else "no"
    out["read /proc/1/root (the sandbox's init)"] = read("/proc/1/root/etc/shadow")
    print(json.dumps(out))
elif mode == "read":
    print(json.dumps({name: read(path) for name, path in json.loads(sys.argv[2]).items()}))
elif mode == "pids":
    children = []
    try:
        for _ in range(5000):
            children.append(subprocess.Popen(["sleep", "600"]))
        print("started", len(children))
    except OSError as exc:
        print("fork refused after", len(children), exc.errno, flush=True)
    time.sleep(600)
elif mode == "memory":
    hog = []
    for i in range(4096):
        hog.append(bytearray(1 << 20))
        hog[-1][::4096] = b"x" * len(hog[-1][::4096])
    print("allocated", len(hog), "MiB", flush=True)
    time.sleep(600)
elif mode in ("tmp", "disk"):
    target = "/tmp/fill" if mode == "tmp" else "fill"
    written = 0
    try:
        with open(target, "wb") as handle:
            for _ in range(4096):
                handle.write(b"x" * (1 << 20))
                handle.flush()
                written += 1
    except OSError as exc:
        print("write refused after", written, "MiB", exc.errno, flush=True)
    time.sleep(600)
"""


def escape_task(root: Path, task_id: str, *, hidden_tests: Path | None = None) -> Task:
    """A task whose workspace holds the escape agent (scored by ``true``: the
    suite reads the agent's report, not the reward)."""
    workspace = root / f"{task_id}-workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "escape.py").write_text(ESCAPE)
    (workspace / "mine.txt").write_text(f"{task_id}'s own file\n")
    return Task(
        id=task_id,
        instruction="get out",
        workspace=DirectoryWorkspace(path=workspace),
        hidden_tests=hidden_tests,
        evaluator=EvaluatorSpec(kind="command", config={"command": "true"}, timeout_s=60),
    )


def escape_harness(mode: str, targets: dict[str, Any] | None = None) -> dict[str, Any]:
    argument = "" if targets is None else " " + _quote(json.dumps(targets))
    return {"name": "shell", "options": {"command": f"python3 escape.py {mode}{argument}"}}


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"
