"""The dashboard over a whole rollout service on this machine (scripted engine,
rollout server, a node running sessions in the real sandbox with the ``shell``
harness's stand-in agent), in headless Chromium: a session finishing shows up
on an open page without reloading it (the server's events over SSE), and the
cancel button cancels a running task."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from selenium.webdriver.common.by import By

from polar.rollout.protocol import HarnessSpec, SessionStatus, TaskStatus, TaskSubmission

from support.agents import agent_task, shell_harness
from support.dashboard import (
    Dashboard,
    console_errors,
    log_in,
    render_all_tokens,
    token_view_ready,
    wait_for,
)
from support.rollout import CONTROL_TOKEN, RolloutStack

TASK_STATUS = "return document.querySelector('.task').dataset.status"


def submit(stack: RolloutStack, root: Path, task_id: str, mode: str, *args: str) -> str:
    with stack.client() as client:
        view = client.submit(
            TaskSubmission(
                task=agent_task(root, task_id=task_id),
                harness=HarnessSpec(**shell_harness(mode, *args)),
                num_samples=2,
            )
        )
    return view.task_id


def test_a_finishing_session_appears_live_and_cancel_cancels(
    tmp_path: Path, tokenizer: Any, browser: Any
) -> None:
    stack = RolloutStack(
        tmp_path / "rollout",
        tokenizer,
        {"turns": [{"text": "Hello from the model."}], "cycle": True},
    )
    board = Dashboard(
        tokenizer,
        control_token=CONTROL_TOKEN,
        server_url=stack.url,
        stores=(tmp_path / "rollout" / "records.db",),
    )
    try:
        log_in(browser, board.url, CONTROL_TOKEN)
        console_errors(browser)
        # --- live: the page is open before the sessions finish, and never reloads
        slow = submit(stack, tmp_path, "slow-task", "slow", "3")
        browser.get(f"{board.url}/tasks/{slow}")
        wait_for(lambda: browser.find_element(By.ID, "live-state").text == "live", "SSE")
        assert browser.execute_script(TASK_STATUS) == "running"
        browser.execute_script("window.__samePage = true")
        wait_for(lambda: browser.execute_script(TASK_STATUS) == "completed", "the task", 180)
        assert browser.execute_script("return window.__samePage") is True
        rows = browser.find_elements(By.CSS_SELECTOR, "table.sessions tbody tr")
        assert len(rows) == 2
        for row in rows:
            assert "completed" in row.text
            assert row.find_elements(By.CSS_SELECTOR, ".status-completed")
        # The finished session's page: result, conversation, calls, token view.
        session = f"{slow}-s0"
        browser.get(f"{board.url}/sessions/{session}")
        assert "after a while" in browser.find_element(By.CSS_SELECTOR, ".conversation").text
        assert (
            "Hello from the model." in browser.find_element(By.CSS_SELECTOR, ".conversation").text
        )
        assert browser.find_elements(By.CSS_SELECTOR, "table.calls tbody tr")
        browser.get(f"{board.url}/sessions/{session}/traces/0")
        token_view_ready(browser)
        render_all_tokens(browser)
        assert browser.execute_script("return document.querySelectorAll('#tokens .t.m1').length")

        # --- cancel: a task whose agent hangs, cancelled from its page
        hung = submit(stack, tmp_path, "hung-task", "hang")
        browser.get(f"{board.url}/tasks/{hung}")
        wait_for(lambda: browser.find_element(By.ID, "live-state").text == "live", "SSE")

        def cancel() -> bool:  # the live page may swap the button for a fresh one meanwhile
            browser.find_element(By.CSS_SELECTOR, "button.cancel").click()
            return True

        wait_for(cancel, "the cancel button to take a click")
        wait_for(lambda: browser.execute_script(TASK_STATUS) == "cancelled", "the cancel", 120)
        with stack.client() as client:
            view = client.task(hung)
        assert view.status is TaskStatus.CANCELLED
        assert {s.status for s in view.sessions} == {SessionStatus.CANCELLED}

        # The task list shows both, each in its group.
        browser.get(board.url + "/")
        listed = browser.find_element(By.CSS_SELECTOR, "main").text
        assert slow in listed and hung in listed
        assert len(browser.find_elements(By.CSS_SELECTOR, "section.group")) == 2
        assert console_errors(browser) == []
    finally:
        browser.get("about:blank")
        board.close()
        stack.close()
