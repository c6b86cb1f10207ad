"""minicoder: a short write-check-revise loop for small models, run in the session's sandbox.

The ``minicoder`` preset (:mod:`polar.harness.presets.minicoder`) copies this
file into the session's HOME and runs it with a Python inside the sandbox,
where the ``polar`` package is hidden: it imports only the standard library.

The loop, within ``max_turns`` model calls:

1. send the system prompt and the instruction (then the conversation so far)
   to ``$OPENAI_BASE_URL/chat/completions`` with ``$OPENAI_API_KEY``, without
   streaming;
2. take the reply's first fenced code block labelled ``python`` / ``py`` or
   unlabelled (the first of them holding a ``def`` when there are several; an
   unclosed last block counts) and write it to ``file`` in the working
   directory;
3. run ``check`` there (a first word ``python`` is this interpreter; an
   empty check: the first code block ends the run); exit status 0: done.
   Otherwise its output's last lines become the next user message, and the
   model may revise. A reply without a code block gets a message saying so.

Progress goes to stdout, one line per turn; how the run ended goes to stderr,
last line ``minicoder: ...``. Exit status:

- 0: the loop ended: the check passed, there is no check (the code was
  written), or the turns ran out (the evaluator scores what was written; the
  stderr line says ``out of turns``);
- 2: the run was misconfigured (a missing variable, an unreadable config);
- 3: a model call failed (the line names the call, and the HTTP status or the
  error), after ``attempts`` tries for connection errors, 429 and 5xx;
- 4: the workspace failed the agent: the file could not be written or the
  check could not be started.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any

SYSTEM = (
    "You are a Python programmer. Answer with the complete code in one ```python code block "
    "and nothing else. Use exactly the function name and parameters you are asked for."
)


class Exit(IntEnum):
    """The program's exit status (see the module docstring)."""

    DONE = 0
    CONFIG = 2
    MODEL = 3
    WORKSPACE = 4


NO_CODE = (
    "Your reply has no ```python code block. "
    "Reply with the complete code in one ```python code block."
)
FAILED = (
    "The examples fail:\n{output}\n"
    "Fix the code and reply with the complete code in one ```python code block."
)
TIMED_OUT = "The examples did not finish within {seconds:g} s."
OUTPUT_LINES = 12
OUTPUT_CHARS = 800
PYTHON_LABELS = ("", "python", "py", "python3")
_FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+.-]*)")


class Stop(Exception):
    """Ends the run with an exit status and a one-line reason."""

    def __init__(self, status: Exit, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class CallFailed(Exception):
    """One model call that got no usable reply; ``retry``: worth another try."""

    def __init__(self, reason: str, *, retry: bool) -> None:
        super().__init__(reason)
        self.retry = retry


@dataclass(frozen=True, slots=True)
class Config:
    """The program's settings (its JSON file), the preset's options."""

    max_turns: int = 3
    """Model calls at most."""
    file: str = "solution.py"
    """Where the code goes, relative to the working directory."""
    check: str = "python examples.py"
    """The command that says whether the code is right (exit 0); empty: none."""
    check_timeout_s: float = 10.0
    max_tokens: int = 256
    """Per reply."""
    temperature: float | None = None
    """None: the engine's default."""
    system: str = SYSTEM
    call_timeout_s: float = 300.0
    attempts: int = 3
    """Tries per model call (connection errors, 429 and 5xx are tried again)."""


@dataclass(frozen=True, slots=True)
class Checked:
    passed: bool
    output: str


def code_block(reply: str) -> str | None:
    """The code the reply offers (see the module docstring), or None."""
    blocks: list[tuple[str, list[str]]] = []
    fence: str | None = None
    for line in reply.splitlines():
        if fence is None:
            opened = _FENCE.match(line)
            if opened:
                fence = opened.group(1)
                blocks.append((opened.group(2).lower(), []))
        elif len(line.strip()) >= len(fence) and set(line.strip()) == {fence[0]}:
            fence = None
        else:
            blocks[-1][1].append(line)
    codes = ["\n".join(lines) + "\n" for label, lines in blocks if label in PYTHON_LABELS]
    codes = [code for code in codes if code.strip()]
    if not codes:
        return None
    return next((code for code in codes if re.search(r"^\s*def ", code, re.M)), codes[0])


def tail(text: str) -> str:
    """The last lines of a check's output, short enough for a small model's prompt."""
    lines = [line.rstrip() for line in text.strip().splitlines()][-OUTPUT_LINES:]
    joined = "\n".join(lines)
    return joined if len(joined) <= OUTPUT_CHARS else "..." + joined[-OUTPUT_CHARS:]


class Model:
    """The gateway's chat completions endpoint, as the session's environment names it."""

    def __init__(self, config: Config, environ: dict[str, str]) -> None:
        missing = [
            name
            for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_MODEL")
            if not environ.get(name)
        ]
        if missing:
            raise Stop(Exit.CONFIG, f"missing environment variables {', '.join(missing)}")
        self.url = environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions"
        self.key = environ["OPENAI_API_KEY"]
        self.model = environ["OPENAI_MODEL"]
        self.config = config
        self.calls = 0

    def reply(self, messages: list[dict[str, str]]) -> str:
        self.calls += 1
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": self.config.max_tokens,
            "stream": False,
        }
        if self.config.temperature is not None:
            body["temperature"] = self.config.temperature
        data = json.dumps(body).encode()
        attempt = 1
        while True:
            try:
                return self._post(data)
            except CallFailed as failure:
                if not failure.retry or attempt >= self.config.attempts:
                    tries = f" ({attempt} tries)" if attempt > 1 else ""
                    raise Stop(
                        Exit.MODEL, f"model call {self.calls} failed{tries}: {failure}"
                    ) from None
            time.sleep(min(2.0 ** (attempt - 1), 8.0))
            attempt += 1

    def _post(self, data: bytes) -> str:
        request = urllib.request.Request(
            self.url,
            data=data,
            method="POST",
            headers={"content-type": "application/json", "authorization": f"Bearer {self.key}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.config.call_timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            text = " ".join(exc.read().decode("utf-8", "replace").split())
            retry = exc.code == 429 or exc.code >= 500
            raise CallFailed(f"HTTP {exc.code}: {text[:300]}", retry=retry) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CallFailed(f"cannot reach {self.url}: {reason}", retry=True) from None
        try:
            content = json.loads(raw)["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise CallFailed(f"unreadable reply: {raw[:200]!r}", retry=False) from None
        return content if isinstance(content, str) else ""


def run_check(config: Config, workdir: Path, environ: dict[str, str]) -> Checked:
    argv = shlex.split(config.check)
    if argv and argv[0] == "python":
        argv[0] = sys.executable
    env = {name: value for name, value in environ.items() if not name.startswith("OPENAI_")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    try:
        process = subprocess.Popen(
            argv,
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as exc:
        raise Stop(Exit.WORKSPACE, f"cannot run the check {config.check!r}: {exc}") from None
    try:
        output, _ = process.communicate(timeout=config.check_timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return Checked(False, TIMED_OUT.format(seconds=config.check_timeout_s))
    return Checked(process.returncode == 0, tail(output.decode("utf-8", "replace")))


def run(config: Config, instruction: str, workdir: Path, environ: dict[str, str]) -> str:
    """The loop; returns how it ended (raises :class:`Stop` for a failed run)."""
    model = Model(config, environ)
    messages = [{"role": "user", "content": instruction}]
    if config.system:
        messages.insert(0, {"role": "system", "content": config.system})
    problem = ""
    for turn in range(1, config.max_turns + 1):
        reply = model.reply(messages)
        messages.append({"role": "assistant", "content": reply})
        code = code_block(reply)
        if code is None:
            problem = "the reply has no code block"
            print(f"turn {turn}: {problem}", flush=True)
            feedback = NO_CODE
        else:
            try:
                (workdir / config.file).write_text(code, encoding="utf-8")
            except OSError as exc:
                raise Stop(Exit.WORKSPACE, f"cannot write {config.file}: {exc}") from None
            wrote = f"wrote {config.file} ({len(code.splitlines())} lines)"
            if not shlex.split(config.check):
                print(f"turn {turn}: {wrote}", flush=True)
                return f"wrote {config.file} after {turn} turn(s); no check configured"
            checked = run_check(config, workdir, environ)
            first = checked.output.splitlines()[0] if checked.output else ""
            verdict = "pass" if checked.passed else "fail"
            print(f"turn {turn}: {wrote}; check: {verdict}: {first}", flush=True)
            if checked.passed:
                return f"the check passes after {turn} turn(s)"
            problem = f"the check fails: {first}"
            feedback = FAILED.format(output=checked.output)
        if turn < config.max_turns:
            messages.append({"role": "user", "content": feedback})
    return f"out of turns ({config.max_turns}); {problem}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="minicoder", description="A write-check-revise loop for small models."
    )
    parser.add_argument("--config", type=Path, required=True, help="JSON file of settings")
    parser.add_argument("instruction")
    args = parser.parse_args(argv)
    try:
        try:
            settings = json.loads(args.config.read_text(encoding="utf-8"))
            config = Config(**settings)
        except (OSError, ValueError, TypeError) as exc:
            raise Stop(Exit.CONFIG, f"cannot read the config {args.config}: {exc}") from None
        ended = run(config, args.instruction, Path.cwd(), dict(os.environ))
    except Stop as stop:
        print(f"minicoder: {stop}", file=sys.stderr, flush=True)
        return stop.status
    print(f"minicoder: {ended}", file=sys.stderr, flush=True)
    return Exit.DONE


if __name__ == "__main__":
    sys.exit(main())
