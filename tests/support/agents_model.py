"""The taught tiny model the real-CLI tests drive (``polar model init`` + ``polar
model warm-up``), built in the background while the rest of the suite runs.

Teaching it is the suite's longest set-up (rehearsing every pinned CLI, then
several hundred warm-up steps: 10 to 16 minutes on two cores), and most of the
suite leaves a core idle. So :func:`start` launches the build as a subprocess
(one torch thread, lowest CPU priority) as soon as tests are collected, the
tests that need the model are moved to the end of the run, and :func:`wait`
(their fixture) joins it. A build that failed in the background is done again
in the foreground, where its error shows; a model already in the cache is kept
in milliseconds either way.

``python -m support.agents_model`` (from ``tests/``) is the background build.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from support.paths import REPO


def _digest(path: Path) -> str:
    return hashlib.sha256(str(path).encode()).hexdigest()[:12]


LOG = REPO / ".cache" / "agents-model-build.log"
"""The background build's output (printed by :func:`wait`)."""

REHEARSALS = Path(tempfile.gettempdir()) / f"polar-rehearsals-{_digest(REPO)}"
"""Where the build rehearses each CLI, and where a test runs it first (see
:mod:`support.cli_runs`): the prompts the model was taught, not new ones. One
place per clone, outside it: in a git checkout, Claude Code, Qwen Code and the
Gemini CLI put the repository's status and recent commits into their prompts."""

_build: subprocess.Popen[bytes] | None = None
_started = 0.0


def build() -> Path:
    """Install the pinned CLIs (if missing), build the tiny model and teach it; the
    taught model's directory. Kept when already built from the same inputs."""
    from polar.cli.model import AGENTS_MODEL_DIR, DEFAULT_MODEL_DIR
    from polar.harness import DEFAULT_CACHE_DIR, install, load_harness
    from polar.harness.exchange import SHELL_EXCHANGES
    from polar.tinymodel.build import build_tiny_model
    from polar.tinymodel.rehearsal import rehearsable, teach_agents

    cache = REPO / DEFAULT_CACHE_DIR
    for name in SHELL_EXCHANGES:
        package = load_harness(name).package
        assert package is not None, name
        install(package, cache)
    base = build_tiny_model(REPO / DEFAULT_MODEL_DIR)
    versions = rehearsable(cache)
    assert set(versions) == set(SHELL_EXCHANGES), versions
    out = REPO / AGENTS_MODEL_DIR
    print(
        f"agents model: {teach_agents(base, out, versions, cache_dir=cache, place=REHEARSALS)}",
        flush=True,
    )
    return out


def start() -> None:
    """Launch the background build (once per test session)."""
    global _build, _started
    if _build is not None:
        return
    LOG.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    with LOG.open("wb") as log:
        _build = subprocess.Popen(
            ["nice", "-n", "19", sys.executable, "-m", "support.agents_model"],
            cwd=REPO / "tests",
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    _started = time.monotonic()


def wait() -> Path:
    """The taught model: the background build's, once it ended, or built here."""
    if _build is not None:
        code = _build.wait()
        took = time.monotonic() - _started
        print(f"background build of the agents model: exit {code} after {took:.0f} s")
        print(LOG.read_text(errors="replace")[-3000:])
    return build()


def stop() -> None:
    """End a background build the session no longer waits for."""
    if _build is not None and _build.poll() is None:
        _build.kill()
        _build.wait()


if __name__ == "__main__":
    import torch

    torch.set_num_threads(1)
    build()
    sys.exit(0)
