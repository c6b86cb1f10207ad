"""Rehearse an agent CLI: run the real CLI once through the gateway in
token-in/token-out mode, with the scripted engine playing a model that knows
the CLI's tool protocol, and keep each call's exact token ids.

What comes back is what a model must read and write to do one tool exchange
with that CLI: the CLI's own system prompt, tool list and instruction as the
gateway renders them (8k-19k tokens for codex, Claude Code and Qwen Code), the
reasoning and the shell tool call the CLI accepts, then (after the CLI ran the
command and came back with its result, a prompt that extends the first) the
answer that ends the run. The warm-up (:mod:`polar.tinymodel.warmup`) teaches the
tiny model these outputs on these prompts, so that the default embedded engine
drives every pinned CLI through a real multi-turn exchange.

Nothing here is copied from a CLI: the prompts are whatever the installed CLI
sends today, recorded live, so a new pin is rehearsed as it is.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polar.harness import RunSpec, load_harness, run_harness
from polar.harness.base import DEFAULT_PATH
from polar.harness.exchange import SHELL_EXCHANGES, ShellExchange
from polar.harness.install import DEFAULT_CACHE_DIR
from polar.ir import PromptOrigin, RecordStatus
from polar.rollout.conversation import request_of
from polar.tinymodel.warmup import WarmupSpec, is_warmed, progress, warm_up

INSTRUCTION = "Write the word polar into proof.txt using the shell."
COMMAND = "echo polar > proof.txt"
REASONING = "I will write the file with the shell tool."
ANSWER = "Wrote proof.txt."
TITLE = "Writing proof.txt"
WORKSPACES = ("work", "w", "projects/agent-workspace/checkout/repository")
"""Where a rehearsal runs the CLI: the first always; the others (a shorter and a
longer path) as well for a CLI that writes the workspace path near the end of
its prompts, where the warm-up trains through the prompt (its ``tail``), so
that the model learns the exchange, not one path."""


class RehearsalFailed(RuntimeError):
    """The CLI did not go through the rehearsed exchange; the message says where."""


@dataclass(frozen=True, slots=True)
class RehearsedCall:
    """One model call of a rehearsal: what the model read and what it wrote, and
    the sampling the CLI asked for (None: it left it to the model's defaults)."""

    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    temperature: float | None = None
    top_p: float | None = None


@dataclass(frozen=True, slots=True)
class Rehearsal:
    harness: str
    calls: tuple[RehearsedCall, ...]
    """In the order the CLI made them (a side call first, where the CLI makes one)."""
    scratch: str
    """The name of the fresh directory the CLI's workspace was made in: unique to
    the run, so where it shows in a prompt, the CLI wrote the workspace path."""

    def names_workspace_within(self, tail: int, decode: Callable[[list[int]], str]) -> bool:
        """Whether some call's last ``tail`` prompt tokens hold the workspace's path."""
        return any(self.scratch in decode(list(c.prompt_ids[-tail:])) for c in self.calls)


def _root(name: str, place: Path) -> Path:
    return place / f"polar-rehearse-{name}"


def _where(root: Path, workspace: str) -> tuple[Path, Path]:
    """(workdir, home) of a CLI run in a rehearsal's directory ``root``."""
    return root / "run" / workspace, root / "home"


@contextmanager
def _fresh(name: str, place: Path | None) -> Iterator[Path]:
    """The directory a rehearsal runs in: a new temporary one, or ``place``'s own
    one for the CLI, emptied."""
    if place is None:
        with tempfile.TemporaryDirectory(prefix=f"polar-rehearse-{name}-") as scratch:
            yield Path(scratch)
        return
    root = _root(name, place)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    yield root


def run_place(name: str, place: Path, workspace: str = WORKSPACES[0]) -> tuple[Path, Path]:
    """(workdir, home), emptied, where :func:`rehearse` ran CLI ``name`` with this
    ``place`` and ``workspace``. The CLI run there again, on the same day, writes
    the rehearsed prompts again: its path and date are what the taught model
    learnt, not ones it must generalise to."""
    workdir, home = _where(_root(name, place), workspace)
    for where in (workdir, home):
        shutil.rmtree(where, ignore_errors=True)
        where.mkdir(parents=True)
    return workdir, home


def script(exchange: ShellExchange) -> dict[str, Any]:
    """The scripted engine's part: think, call the shell tool, then end the run."""
    final: dict[str, Any] = (
        {"tool_calls": [exchange.call(exchange.done_command)]}
        if exchange.done_command
        else {"text": ANSWER}
    )
    out: dict[str, Any] = {
        "turns": [
            {
                "reasoning": REASONING,
                "tool_calls": [exchange.call(COMMAND)],
                "expect": {"prompt_contains": f'"name": "{exchange.tool}"'},
            },
            {**final, "expect": {"prompt_contains": "<tool_response>"}},
        ]
    }
    if exchange.title_prompt:
        out["side"] = [{"when": {"prompt_contains": exchange.title_prompt}, "text": TITLE}]
    return out


def rehearse(
    name: str,
    tokenizer_dir: Path,
    *,
    cache_dir: Path = DEFAULT_CACHE_DIR,
    path: str = DEFAULT_PATH,
    timeout_s: float = 300.0,
    workspace: str = WORKSPACES[0],
    place: Path | None = None,
) -> Rehearsal:
    """Run the installed CLI ``name`` once through a scripted gateway, in a fresh
    directory's ``workspace`` (a relative path); its calls. The fresh directory is
    a new temporary one, or ``place / "polar-rehearse-<name>"`` emptied first (see
    :func:`run_place`).

    Raises :class:`RehearsalFailed` if the CLI did anything but the scripted
    exchange (a non-zero exit, an unexpected request, a prompt that does not
    extend the previous one).
    """
    import httpx

    from polar.proxy.app import create_app
    from polar.proxy.config import GatewayConfig
    from polar.proxy.gateway import Gateway
    from polar.proxy.store import SqliteStore
    from polar.serverthread import ServerThread
    from polar.testing.scripted import Script, ScriptedEngine
    from polar.tokenizer import load_tokenizer

    exchange = SHELL_EXCHANGES.get(name)
    if exchange is None:
        raise RehearsalFailed(f"no shell exchange is known for harness {name!r}")
    harness = load_harness(name)
    admin = secrets.token_urlsafe(24)
    with _fresh(name, place) as root:
        engine = ScriptedEngine(
            Script.from_dict(script(exchange)), load_tokenizer(tokenizer_dir), model="policy"
        ).start()
        try:
            config = GatewayConfig.model_validate(
                {
                    "admin_token": admin,
                    "capture": "token_in_token_out",
                    "engine": {"kind": "vllm", "base_url": engine.url, "model": "policy"},
                    "render": {"tokenizer": str(tokenizer_dir)},
                    "store": {"path": str(root / "records.db")},
                }
            )
            with ServerThread(create_app(Gateway(config))) as gateway:
                created = httpx.post(
                    f"{gateway.url}/admin/sessions",
                    headers={"authorization": f"Bearer {admin}"},
                    json={"metadata": {"harness": name, "rehearsal": True}},
                    timeout=30,
                )
                created.raise_for_status()
                session = created.json()
                workdir, home = _where(root, workspace)
                workdir.mkdir(parents=True)
                spec = RunSpec(
                    gateway_url=gateway.url,
                    api_key=session["api_key"],
                    model="policy",
                    instruction=INSTRUCTION,
                    workdir=workdir,
                    home=home,
                    timeout_s=timeout_s,
                    path=path,
                )
                run = run_harness(harness, spec, cache_dir=cache_dir).result
            failures = engine.failures
            unused = engine.remaining
        finally:
            engine.stop()
        store = SqliteStore(root / "records.db")
        try:
            records = store.records(session["session_id"])
        finally:
            store.close()
    where = f"rehearsing {name}"
    if not run.ok:
        tail = (run.stderr or run.stdout)[-600:]
        raise RehearsalFailed(f"{where}: the CLI exited {run.exit_code}: {tail}")
    if failures:
        raise RehearsalFailed(f"{where}: unexpected request: {failures[0]}")
    if unused:
        raise RehearsalFailed(f"{where}: the CLI stopped with {unused} scripted turns left")
    expected = 2 + int(exchange.title_prompt is not None)
    if len(records) != expected or any(r.status is not RecordStatus.COMPLETED for r in records):
        raise RehearsalFailed(
            f"{where}: {len(records)} calls recorded, not the {expected} of the scripted exchange"
        )
    lineage = records[-1].lineage
    if lineage is None or lineage.origin is not PromptOrigin.EXTENDS or not lineage.spliced:
        raise RehearsalFailed(f"{where}: the second call does not extend the first")
    asked = [request_of(r).sampling for r in records]
    return Rehearsal(
        harness=name,
        calls=tuple(
            RehearsedCall(tuple(r.prompt_ids), tuple(r.output_ids), s.temperature, s.top_p)
            for r, s in zip(records, asked, strict=True)
        ),
        scratch=root.name,
    )


def rehearsable(cache_dir: Path, names: Sequence[str] | None = None) -> dict[str, str]:
    """The CLIs to rehearse and their installed versions: ``names`` (each must be a
    known, installed CLI: ValueError otherwise), or every pinned CLI installed in
    ``cache_dir``."""
    from polar.harness.install import installed_version

    unknown = [n for n in names or () if n not in SHELL_EXCHANGES]
    if unknown:
        raise ValueError(f"unknown harness {unknown[0]!r}; known: {', '.join(SHELL_EXCHANGES)}")
    versions: dict[str, str] = {}
    for name in names if names is not None else list(SHELL_EXCHANGES):
        package = load_harness(name).package
        version = installed_version(package, cache_dir) if package else None
        if version is not None:
            versions[name] = version
        elif names is not None:
            raise ValueError(
                f"{name} is not installed in {cache_dir}: run `polar harness install {name}`"
            )
    return versions


def teach_agents(
    base: Path,
    out: Path,
    versions: Mapping[str, str],
    *,
    cache_dir: Path = DEFAULT_CACHE_DIR,
    spec: WarmupSpec | None = None,
    echo: Callable[[str], None] = print,
    place: Path | None = None,
) -> dict[str, Any]:
    """Rehearse each CLI in ``versions`` (see :func:`rehearsable`) and warm the model
    in ``base`` up into ``out`` on the synthetic dialogues and the rehearsed calls.
    A model already taught from the same base, spec, CLI versions and ``place``
    is kept. ``place``: where the rehearsals run (see :func:`rehearse` and
    :func:`run_place`); new temporary directories if None."""
    spec = spec or WarmupSpec()
    origin = {**versions, "@workspaces": ",".join(WORKSPACES), "@taught_at": "model defaults"}
    if place is not None:
        origin["@place"] = str(place.resolve())
    if is_warmed(out, spec, base, origin):
        return {"kept": str(out)}
    from polar.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(base)

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids)

    calls: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    most = len(versions) * len(WORKSPACES)  # a CLI's later workspaces may be skipped
    done = 0
    started = time.monotonic()
    for name, version in versions.items():
        for workspace in WORKSPACES:
            echo(f"rehearsing {name} {version} in {workspace}/ ({done + 1} of at most {most})")
            rehearsal = rehearse(name, base, cache_dir=cache_dir, workspace=workspace, place=place)
            done += 1
            calls += [(c.prompt_ids, c.output_ids) for c in rehearsal.calls]
            lengths = ", ".join(str(len(c.prompt_ids)) for c in rehearsal.calls)
            pace = progress(time.monotonic() - started, done, most, early_stop=True)
            echo(f"  {len(rehearsal.calls)} calls, prompts of {lengths} tokens ({pace})")
            if not rehearsal.names_workspace_within(spec.tail, decode):
                break
    # Every call is taught at the model's own sampling, not at what its CLI asked
    # (the Gemini CLI: temperature 1): the taught model is driven at its defaults,
    # enforced by the gateway (sampling.policy), as a training run's gateway does: at
    # temperature 1 the memoriser kept a second token in the nucleus on prompts whose
    # paths differ from the rehearsed ones.
    return warm_up(base, out, spec, rehearsed=calls, rehearsed_from=origin)
