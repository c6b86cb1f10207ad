"""The dashboard in headless Chromium over a real record store holding the
repository's recorded CLI sessions (``tests/fixtures/sessions``): every page
loads without a console error, and the token view shows each trace's tokens,
exactly, with the colour of their loss mask."""

from __future__ import annotations

from typing import Any

import pytest
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By

from polar.trajectory import BuildConfig, PrefixMerge, TurnFormat

from support.dashboard import (
    Dashboard,
    console_errors,
    log_in,
    recorded_sessions,
    render_all_tokens,
    token_view_ready,
    wait_for,
)

TRAINED = "rgb(207, 232, 255)"  # --trained in dashboard.css
NOT_TRAINED = "rgb(228, 231, 235)"  # --untrained
MASKS = """return Array.from(document.querySelectorAll('#tokens .t'),
    s => s.classList.contains('m1') ? 1 : 0)"""
COLOURS = """return Array.from(new Set(Array.from(
    document.querySelectorAll('#tokens .t.' + arguments[0]),
    s => getComputedStyle(s).backgroundColor)))"""

PLAIN_TRAINED = """return Array.from(document.querySelectorAll('#tokens .t.m1'))
    .find(s => s.textContent.trim().length > 1 && !s.textContent.includes('\\n'))"""


@pytest.fixture(scope="module")
def logged_in(browser: Any, dashboard: Dashboard) -> Any:
    log_in(browser, dashboard.url)
    return browser


def test_every_page_loads_without_console_errors(logged_in: Any, dashboard: Dashboard) -> None:
    driver = logged_in
    console_errors(driver)  # drain what the login left
    sessions = sorted(recorded_sessions())
    paths = ["/", "/sessions", "/training"]
    for session in sessions:
        paths += [f"/sessions/{session}", f"/sessions/{session}/traces/0"]
    for path in paths:
        driver.get(dashboard.url + path)
        wait_for(lambda: driver.execute_script("return document.readyState") == "complete", path)
        if "/traces/" in path:
            token_view_ready(driver)
        assert driver.find_element(By.TAG_NAME, "h1").text, path
        assert console_errors(driver) == [], path
    # The session page shows the conversation beside the recorded calls.
    driver.get(f"{dashboard.url}/sessions/codex.token_in_token_out")
    calls = driver.find_elements(By.CSS_SELECTOR, "table.calls tbody tr")
    assert len(calls) == 2
    assert driver.find_elements(By.CSS_SELECTOR, "article.role-assistant")
    assert driver.find_elements(By.CSS_SELECTOR, "article.role-tool")


@pytest.mark.parametrize(
    "session",
    [
        "mini_swe_agent.token_in_token_out",
        "codex.engine_rendered",
        "opencode.token_in_token_out",
    ],
)
def test_the_token_view_shows_every_token_with_its_mask_colour(
    logged_in: Any, dashboard: Dashboard, tokenizer: Any, session: str
) -> None:
    driver = logged_in
    records = recorded_sessions()[session]
    trajectory = PrefixMerge(BuildConfig(turns=TurnFormat.from_tokenizer(tokenizer))).build(records)
    assert trajectory.traces
    for index, trace in enumerate(trajectory.traces):
        driver.get(f"{dashboard.url}/sessions/{session}/traces/{index}")
        token_view_ready(driver)
        render_all_tokens(driver)
        expected = [0] * len(trace.prompt_ids) + list(trace.loss_mask)
        assert driver.execute_script(MASKS) == expected, trace.id
        assert driver.execute_script(COLOURS, "m1") == [TRAINED]
        assert driver.execute_script(COLOURS, "m0") == [NOT_TRAINED]
        first = driver.find_element(By.CSS_SELECTOR, "#tokens .t")
        assert first.text == "<|im_start|>"
        if trace.break_reason is not None:
            breaks = driver.find_elements(By.CSS_SELECTOR, "#tokens .mk-break")
            assert [b.text for b in breaks] == [
                f"break: {trace.break_reason.value} (segment {trace.segment})"
            ]
            assert driver.find_elements(By.CSS_SELECTOR, "#tokens .mk-drift")
        turns = driver.find_elements(By.CSS_SELECTOR, "#tokens .mk-turn")
        assert sum(t.text.endswith(": sampled") for t in turns) == len(trace.turns)
        # Hovering a trained token shows its id and logprob.
        trained = driver.execute_script(PLAIN_TRAINED)
        heading = driver.find_element(By.TAG_NAME, "h1")
        ActionChains(driver).move_to_element(heading).move_to_element(trained).perform()
        tip = wait_for(lambda: driver.find_element(By.ID, "tip").text, "the hover tip")
        position = int(trained.get_attribute("data-i"))
        response_at = position - len(trace.prompt_ids)
        assert f"id {trace.response_ids[response_at]}" in tip
        assert f"logprob {trace.response_logprobs[response_at]:.4f}" in tip
        assert console_errors(driver) == []


FIRST_TRAINED = """const span = document.querySelector('#tokens .first-trained');
    const box = span.getBoundingClientRect();
    return {i: Number(span.dataset.i), top: box.top, bottom: box.bottom,
            height: innerHeight, scrolled: scrollY,
            landed: document.getElementById('tokens').dataset.landedAt}"""


def test_the_token_view_opens_on_the_first_trained_token(
    logged_in: Any, dashboard: Dashboard, tokenizer: Any
) -> None:
    """Past a prompt taller than the window, the view lands on the first trained
    token; the summary's link goes back to it after scrolling away."""
    driver = logged_in
    console_errors(driver)  # drain what the login left
    driver.set_window_size(1400, 900)
    session = "qwen_code.token_in_token_out"
    (trace, *_) = (
        PrefixMerge(BuildConfig(turns=TurnFormat.from_tokenizer(tokenizer)))
        .build(recorded_sessions()[session])
        .traces
    )
    first = len(trace.prompt_ids) + list(trace.loss_mask).index(1)
    driver.get(f"{dashboard.url}/sessions/{session}/traces/0")
    token_view_ready(driver)
    shown = wait_for(lambda: driver.execute_script(FIRST_TRAINED), "the first trained token")
    assert (shown["i"], shown["landed"]) == (first, str(first))
    assert shown["scrolled"] > 1000  # the prompt above it is long
    assert shown["top"] >= 0 and shown["bottom"] <= shown["height"]
    driver.execute_script("window.scrollTo(0, 0)")
    driver.find_element(By.ID, "first-trained-link").click()
    again = driver.execute_script(FIRST_TRAINED)
    assert again["scrolled"] > 1000 and again["top"] >= 0 and again["bottom"] <= again["height"]
    assert console_errors(driver) == []
