"""The dashboard under test: a real record store filled with the repository's
recorded CLI sessions, the dashboard app on a real HTTP server, and headless
Chromium (Debian's ``chromium`` and ``chromium-driver``, driven by Selenium).

Chromium is the only browser here and nothing is downloaded: the driver is the
Debian package's ``/usr/bin/chromedriver`` (``scripts/setup --browser``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from polar.dashboard import DashboardConfig, create_dashboard_app
from polar.ir import CompletionRecord
from polar.ir.codec import record_from_json
from polar.proxy.store import SessionRow, SqliteStore
from polar.serverthread import ServerThread
from polar.sft.stats import GenerationStats
from polar.sft.verdict import AttemptKey, FilterReason, Filters, Outcome, Verdict

from support.paths import FIXTURES

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
TOKEN = "dashboard-test-token-0123456789"
SESSIONS = FIXTURES / "sessions"
SCROLL_TO_UNRENDERED = """
const next = document.querySelector('#tokens .chunk:not([data-rendered])');
if (next) { next.scrollIntoView(); return false; }
return Boolean(document.getElementById('tokens').dataset.complete);
"""


def recorded_sessions() -> dict[str, list[CompletionRecord]]:
    """Every recorded CLI session, under the name ``<cli>.<capture>`` as its id."""
    sessions: dict[str, list[CompletionRecord]] = {}
    for path in sorted(SESSIONS.glob("*.jsonl")):
        records = [record_from_json(orjson.loads(line)) for line in path.read_bytes().splitlines()]
        sessions[path.stem] = [_renamed(r, path.stem) for r in records]
    return sessions


def _renamed(record: CompletionRecord, session_id: str) -> CompletionRecord:
    from dataclasses import replace

    return replace(record, session_id=session_id)


def fill_store(path: Path, sessions: dict[str, list[CompletionRecord]]) -> None:
    """Write ``sessions`` into a real record store through its writer, as a gateway does."""

    async def fill() -> None:
        store = SqliteStore(path)
        store.open()
        try:
            for session_id, records in sessions.items():
                created = records[0].timings.arrived
                await store.insert_session(
                    SessionRow(
                        id=session_id,
                        key_hash=hashlib.sha256(session_id.encode()).hexdigest(),
                        created_at=created,
                        closed_at=None,
                        metadata={},
                        last_seq=0,
                    )
                )
                for record in records:
                    await store.append(record)
                await store.close_session(session_id, created + 60)
        finally:
            store.close()

    asyncio.run(fill())


class Dashboard:
    """The dashboard app on a real HTTP server (stopped by :meth:`close`)."""

    def __init__(self, tokenizer: Any, **config: Any) -> None:
        config.setdefault("control_token", TOKEN)
        self.config = DashboardConfig(port=0, **config)
        self.thread = ServerThread(create_dashboard_app(self.config, tokenizer)).start()
        self.url = self.thread.url

    def close(self) -> None:
        self.thread.stop()


def have_browser() -> bool:
    return CHROMIUM.is_file() and CHROMEDRIVER.is_file() and shutil.which("chromium") is not None


def start_browser(profile: Path) -> Any:
    """Headless Chromium with a fresh profile, its console log kept."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))


def log_in(driver: Any, url: str, token: str = TOKEN) -> None:
    from selenium.webdriver.common.by import By

    driver.get(f"{url}/login")
    driver.find_element(By.NAME, "token").send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "form.login button").click()
    wait_for(lambda: driver.current_url.rstrip("/") == url, "the login to go through")


def console_errors(driver: Any) -> list[dict[str, Any]]:
    """Console messages at level SEVERE since the last call (the log is drained)."""
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def wait_for(check: Callable[[], Any], what: str, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = check()
        except Exception:  # the page may be between renders
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(0.05)


def render_all_tokens(driver: Any, timeout_s: float = 120.0) -> None:
    """Scroll the token view to its end until every chunk has rendered."""

    def complete() -> bool:
        return bool(driver.execute_script(SCROLL_TO_UNRENDERED))

    wait_for(complete, "every chunk of the token view to render", timeout_s)


def token_view_ready(driver: Any) -> None:
    wait_for(
        lambda: driver.execute_script(
            "return document.getElementById('tokens').dataset.state === 'ready'"
        ),
        "the token view to load",
    )


def step_metrics(step: int) -> dict[str, float]:
    """A training step's metrics under the trainer's names (made-up values)."""
    return {
        "reward/mean": 0.2 + 0.6 * (1 - math.exp(-step / 8)),
        "groups/zero_advantage_fraction": 0.5 * math.exp(-step / 10),
        "mismatch/kl": 1e-3 * (1 + step % 3),
        "loss/kl": 2e-3,
        "staleness/mean": step % 2,
        "staleness/max": 1 + step % 2,
    }


def write_stats(path: Path, attempts: int) -> None:
    """SFT statistics as the generator writes them, ``attempts`` of one task judged."""
    verdicts = [
        Verdict(AttemptKey("fix-bug", i), Outcome.ACCEPTED if i % 2 == 0 else Outcome.TESTS_FAILED)
        for i in range(attempts)
    ]
    verdicts.append(Verdict(AttemptKey("add-test", 0), Outcome.FILTERED, FilterReason.TOO_LONG))
    stats = GenerationStats.of("resolved", Filters(), {"fix-bug": 4, "add-test": 2}, verdicts)
    path.write_text(json.dumps(stats.to_json()))
