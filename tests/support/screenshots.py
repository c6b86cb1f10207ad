"""Screenshots of the dashboard's views for the README (``docs/images/dashboard-*.png``).

    PYTHONPATH=tests .venv/bin/python -m support.screenshots [docs/images]

Everything on them is real: a rollout service on this machine (scripted
engine, rollout server, a node running the ``shell`` harness's stand-in agent
in the sandbox), the recorded CLI sessions of ``tests/fixtures/sessions`` in a
record store, and a metrics log and SFT statistics written by the trainer's and
the SFT generator's own writers (with made-up values). Needs Debian's chromium
and chromium-driver (``scripts/setup --browser``).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from selenium.webdriver.common.by import By

from polar.rollout.protocol import HarnessSpec, TaskSubmission
from polar.tokenizer import load_tokenizer
from polar.train.tracking import MetricsLog

from support.agents import CONVERSE_SCRIPT, agent_task, shell_harness
from support.dashboard import (
    Dashboard,
    fill_store,
    log_in,
    recorded_sessions,
    render_all_tokens,
    start_browser,
    step_metrics,
    token_view_ready,
    wait_for,
    write_stats,
)
from support.rollout import CONTROL_TOKEN, RolloutStack

TASK_STATUS = "return document.querySelector('.task').dataset.status"


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        script = {
            "sessions": [
                {**CONVERSE_SCRIPT, "session": "^fix-the-bug-"},
                {"session": "^long-run-", "turns": [{"text": "Looking."}], "cycle": True},
            ]
        }
        stack = RolloutStack(root / "rollout", tokenizer, script)
        fixtures = root / "fixtures.db"
        fill_store(fixtures, recorded_sessions())
        run = root / "run"
        log = MetricsLog(run, jsonl=True, tensorboard=False, progress=False, total_steps=60)
        for step in range(1, 41):
            log.write(step, step, step_metrics(step))
        write_stats(root / "stats.json", 4)
        board = Dashboard(
            tokenizer,
            control_token=CONTROL_TOKEN,
            server_url=stack.url,
            stores=(root / "rollout" / "records.db", fixtures),
            metrics=run,
            sft=root / "stats.json",
        )
        driver = start_browser(root / "profile")
        try:
            shoot(driver, board, stack, root, out)
        finally:
            driver.get("about:blank")
            driver.quit()
            board.close()
            stack.close()


def submit(stack: RolloutStack, root: Path, task_id: str, mode: str, samples: int) -> str:
    with stack.client() as client:
        return client.submit(
            TaskSubmission(
                task=agent_task(root, task_id=task_id),
                harness=HarnessSpec(**shell_harness(mode)),
                num_samples=samples,
                task_id=task_id,
            )
        ).task_id


def shoot(driver: Any, board: Dashboard, stack: RolloutStack, root: Path, out: Path) -> None:
    driver.set_window_size(1400, 900)
    log_in(driver, board.url, CONTROL_TOKEN)
    solved = submit(stack, root, "fix-the-bug", "converse", 3)
    driver.get(f"{board.url}/tasks/{solved}")
    wait_for(lambda: driver.execute_script(TASK_STATUS) == "completed", "the task", 300)
    running = submit(stack, root, "long-run", "hang", 2)
    driver.get(f"{board.url}/tasks/{running}")
    wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, ".sessions .status-running"), "an agent")
    time.sleep(1)
    driver.save_screenshot(str(out / "dashboard-task-live.png"))
    driver.get(f"{board.url}/")
    wait_for(lambda: driver.find_element(By.ID, "live-state").text == "live", "SSE")
    driver.save_screenshot(str(out / "dashboard-tasks.png"))
    driver.get(f"{board.url}/tasks/{solved}")
    driver.save_screenshot(str(out / "dashboard-task.png"))
    driver.get(f"{board.url}/sessions/{solved}-s0")
    driver.save_screenshot(str(out / "dashboard-session.png"))
    driver.get(f"{board.url}/sessions/qwen_code.engine_rendered/traces/1")
    token_view_ready(driver)
    render_all_tokens(driver)
    drift = driver.find_elements(By.CSS_SELECTOR, "#tokens .mk-drift")
    if drift:
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", drift[0])
    driver.save_screenshot(str(out / "dashboard-tokens.png"))
    driver.get(f"{board.url}/sessions/qwen_code.token_in_token_out/traces/0")
    token_view_ready(driver)
    render_all_tokens(driver)
    sampled = driver.find_elements(By.CSS_SELECTOR, "#tokens .mk-turn")
    if sampled:
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", sampled[-1])
        trained = driver.find_elements(By.CSS_SELECTOR, "#tokens .t.m1")
        if trained:
            from selenium.webdriver.common.action_chains import ActionChains

            ActionChains(driver).move_to_element(trained[len(trained) // 2]).perform()
    driver.save_screenshot(str(out / "dashboard-tokens-hover.png"))
    first_trained(driver, board.url, out)
    with stack.client() as client:
        client.cancel(running)
    driver.get(f"{board.url}/training")
    driver.save_screenshot(str(out / "dashboard-training.png"))


def first_trained(driver: Any, url: str, out: Path) -> None:
    """The token view as it opens: on the first trained token, past the prompt."""
    driver.get(f"{url}/sessions/qwen_code.token_in_token_out/traces/0")
    token_view_ready(driver)
    wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, "#tokens .first-trained"), "landing")
    time.sleep(0.5)
    driver.save_screenshot(str(out / "dashboard-tokens-first-trained.png"))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs/images"))
