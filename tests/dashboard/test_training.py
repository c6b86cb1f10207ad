"""The training page in headless Chromium: curves from a metrics log written by
the trainer's own writer (:class:`polar.train.tracking.MetricsLog`, with the
metric names the trainer logs; the values are made up here, as a real run
would take minutes) and an SFT generation's statistics written by
:class:`polar.sft.stats.GenerationStats`; both grow while the page is open."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from selenium.webdriver.common.by import By

from polar.train.tracking import MetricsLog

from support.dashboard import (
    Dashboard,
    console_errors,
    log_in,
    step_metrics,
    wait_for,
    write_stats,
)


def test_training_curves_and_sft_statistics_follow_their_files(
    tmp_path: Path, tokenizer: Any, browser: Any
) -> None:
    run = tmp_path / "run"
    log = MetricsLog(run, jsonl=True, tensorboard=False, progress=False, total_steps=40)
    for step in range(1, 11):
        log.write(step, step, step_metrics(step))
    with (run / "metrics.jsonl").open("a") as f:
        f.write("not json\n")
    sft = tmp_path / "sft"
    sft.mkdir()
    write_stats(sft / "stats.json", 2)
    board = Dashboard(tokenizer, metrics=run, sft=sft)
    try:
        log_in(browser, board.url)
        console_errors(browser)
        browser.get(f"{board.url}/training")
        charts = browser.find_elements(By.CSS_SELECTOR, "figure.chart")
        titles = [c.find_element(By.TAG_NAME, "figcaption").text for c in charts]
        assert titles == ["Reward", "Zero-advantage fraction", "KL", "Staleness"]
        assert "10 steps" in browser.find_element(By.CSS_SELECTOR, "main").text
        assert "1 line(s) unreadable" in browser.find_element(By.CSS_SELECTOR, "main").text
        reward = charts[0].find_element(By.CSS_SELECTOR, "polyline")
        assert len(reward.get_attribute("points").split()) == 10
        assert reward.value_of_css_property("fill") == "none"  # a line, not an area
        # Two series on the KL and staleness charts.
        assert len(charts[2].find_elements(By.CSS_SELECTOR, "polyline")) == 2
        sft_rows = browser.find_elements(By.CSS_SELECTOR, "table.sft tbody tr")
        assert [r.text.split()[0] for r in sft_rows] == ["overall", "fix-bug", "add-test"]
        assert sft_rows[0].text.split()[1:4] == ["6", "3", "1"]
        # The run goes on: the page picks up the new steps and attempts by itself.
        for step in range(11, 21):
            log.write(step, step, step_metrics(step))
        write_stats(sft / "stats.json", 4)
        wait_for(
            lambda: "20 steps" in browser.find_element(By.CSS_SELECTOR, "main").text,
            "the new steps",
            30,
        )
        wait_for(
            lambda: (
                browser.find_elements(By.CSS_SELECTOR, "table.sft tbody tr")[0].text.split()[1:4]
                == ["6", "5", "2"]
            ),
            "the new attempts",
            30,
        )
        assert console_errors(browser) == []
    finally:
        browser.get("about:blank")
        board.close()
