"""Playing a script: which turn answers each request, and a record of what arrived.

The scripted engine's HTTP routes hand every request to one :class:`ScriptPlayer`;
it picks the session's script, checks the request against the turn's
expectations, and keeps the requests, sessions and mismatches the engine
reports. It is thread-safe (the server answers on its own thread; tests read
the record from theirs).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from polar.proxy.engines.base import SESSION_HEADER
from polar.testing.scripted.script import ObservedRequest, Script, SessionScripts, Turn


class ScriptMismatch(Exception):
    """A request the script does not allow; its message is kept in ``failures``."""


@dataclass(slots=True)
class _State:
    requests: list[dict[str, Any]] = field(default_factory=list)
    sessions: list[str | None] = field(default_factory=list)
    """The session header of each request in ``requests`` (``None``: none sent)."""
    failures: list[str] = field(default_factory=list)
    positions: dict[str | None, int] = field(default_factory=dict)
    """Turns used, per session (``None``: the one script of a single-script engine)."""
    assigned: dict[str, int] = field(default_factory=dict)
    """Per-session scripts: session -> index of the script it follows."""
    taken: int = 0
    """Per-session scripts without a ``session`` pattern handed out so far."""


class ScriptPlayer:
    """Hands out the scripted turns, one per request, and records the requests."""

    def __init__(self, script: Script | SessionScripts) -> None:
        self.script = script
        self._state = _State()
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- record

    @property
    def failures(self) -> list[str]:
        with self._lock:
            return list(self._state.failures)

    @property
    def requests(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._state.requests)

    @property
    def sessions(self) -> list[str | None]:
        with self._lock:
            return list(self._state.sessions)

    @property
    def assignments(self) -> dict[str, int]:
        with self._lock:
            return dict(self._state.assigned)

    @property
    def remaining(self) -> int:
        """Scripted turns not used yet (cycling scripts count none)."""
        with self._lock:
            if isinstance(self.script, Script):
                pairs = [(self.script, self._state.positions.get(None, 0))]
            else:
                pairs = []
                for i, script in enumerate(self.script.scripts):
                    sessions = [s for s, j in self._state.assigned.items() if j == i]
                    pairs += [(script, self._state.positions.get(s, 0)) for s in sessions]
                    if not sessions:
                        pairs.append((script, 0))
            return sum(len(s.turns) - used for s, used in pairs if not s.cycle)

    def fail(self, message: str) -> None:
        """Record a mismatch found outside the script (an unsupported request)."""
        with self._lock:
            self._state.failures.append(message)

    # ---------------------------------------------------------------- turns

    def next_turn(self, body: dict[str, Any], seen: ObservedRequest, session: str | None) -> Turn:
        """The turn that answers this request; raises :class:`ScriptMismatch` (recorded)."""
        with self._lock:
            self._state.requests.append(body)
            self._state.sessions.append(session)
            try:
                script, key, name = self._script_for(session)
            except ScriptMismatch as exc:
                self._state.failures.append(str(exc))
                raise
            side = script.side_reply(seen)
            if side is not None:
                return side
            index = self._state.positions.get(key, 0)
            turns = script.turns
            if index >= len(turns) and not script.cycle:
                message = f"request {index + 1} arrived but {name} has only {len(turns)} turns"
                self._state.failures.append(message)
                raise ScriptMismatch(message)
            turn = turns[index % len(turns)]
            problems = turn.expect.problems(seen) if turn.expect else []
            if problems:
                message = f"request {index + 1} does not match {name}: " + "; ".join(problems)
                self._state.failures.append(message)
                raise ScriptMismatch(message)
            self._state.positions[key] = index + 1
            return turn

    def _script_for(self, session: str | None) -> tuple[Script, str | None, str]:
        """(script, state key, how to name it in messages); lock held."""
        if isinstance(self.script, Script):
            return self.script, None, "the script"
        if session is None:
            raise ScriptMismatch(f"per-session scripts need the {SESSION_HEADER} header")
        index = self._state.assigned.get(session)
        if index is None:
            index = self._assign(self.script, session)
            self._state.assigned[session] = index
        return self.script.scripts[index], session, f"session script {index}"

    def _assign(self, scripts: SessionScripts, session: str) -> int:
        """The script a new session follows: the first whose pattern matches, else the
        next without a pattern; lock held."""
        matching = [
            i for i, s in enumerate(scripts.scripts) if s.session and s.session.search(session)
        ]
        if matching:
            return matching[0]
        free = [i for i, s in enumerate(scripts.scripts) if s.session is None]
        if self._state.taken >= len(free):
            raise ScriptMismatch(
                f"session {session} is session {self._state.taken + 1} without a "
                f"pattern of its own, but there are only {len(free)} such session scripts"
            )
        self._state.taken += 1
        return free[self._state.taken - 1]
