"""The dashboard over sessions run through the real gateway (scripted engine,
token-in/token-out capture, the real Qwen3 template and tokenizer), in headless
Chromium: what an agent wrote is shown as text, never run, and a 100k-token
trace renders without freezing the page."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from selenium.webdriver.common.by import By

from polar.trajectory import BuildConfig, PrefixMerge, TurnFormat

from support.dashboard import (
    Dashboard,
    console_errors,
    log_in,
    render_all_tokens,
    token_view_ready,
    wait_for,
)
from support.stack import BASH_TOOL, Stack

HOSTILE = (
    "</pre></article><script>window.__pwned = 1</script>"
    '<img src=x onerror="window.__pwned = 2"><b>bold</b>'
)
WATCH_LONG_TASKS = """
window.__longest = 0;
new PerformanceObserver((list) => {
  for (const entry of list.getEntries()) {
    window.__longest = Math.max(window.__longest, entry.duration);
  }
}).observe({type: 'longtask'});
return PerformanceObserver.supportedEntryTypes.includes('longtask');
"""


BUSY = "setTimeout(() => { const t = performance.now(); while (performance.now() - t < 150); })"


def run_session(stack: Stack, tool_outputs: list[str], prompt: str) -> str:
    """A harness's session: a user prompt, then one tool round trip per output."""
    session_id, key = stack.new_session()
    client = stack.openai(key)
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    for output in [*tool_outputs, None]:
        reply = client.chat.completions.create(
            model="scripted", messages=messages, tools=[BASH_TOOL]
        )  # type: ignore[call-overload]
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if output is None:
            break
        call = message.tool_calls[0]
        messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    return session_id


def test_what_agents_wrote_is_shown_as_text_and_never_run(
    make_stack: Callable[..., Stack], tokenizer: Any, browser: Any
) -> None:
    stack = make_stack(
        {
            "turns": [
                {
                    "reasoning": f"Think {HOSTILE}",
                    "tool_calls": [{"name": "bash", "arguments": {"command": HOSTILE}}],
                },
                {"text": f"Done {HOSTILE}"},
            ]
        },
        capture="token_in_token_out",
    )
    session = run_session(stack, [f"output {HOSTILE}"], f"Fix it {HOSTILE}")
    board = Dashboard(tokenizer, stores=(stack.db_path,))
    try:
        log_in(browser, board.url)
        console_errors(browser)
        browser.get(f"{board.url}/sessions/{session}")
        text = browser.find_element(By.CSS_SELECTOR, "section.conversation").text
        # user prompt, reasoning, tool output, answer; the tool call's arguments as JSON
        assert text.count(HOSTILE) == 4, text
        assert 'bash({"command": "</pre></article><script>' in text
        assert browser.execute_script("return window.__pwned") is None
        assert browser.find_elements(By.CSS_SELECTOR, "main img, main b, main script") == []
        browser.get(f"{board.url}/sessions/{session}/traces/0")
        token_view_ready(browser)
        render_all_tokens(browser)
        shown = browser.find_element(By.ID, "tokens").text
        assert "<script>window.__pwned = 1</script>" in shown
        assert browser.execute_script("return window.__pwned") is None
        assert browser.find_elements(By.CSS_SELECTOR, "main img, main b, main script") == []
        assert console_errors(browser) == []
    finally:
        browser.get("about:blank")
        board.close()


LINE = "src/module_{i}.py:{j}: def function_{j}(arg): return arg * {i}  # a line of code\n"


def test_a_100k_token_trace_renders_in_chunks_without_freezing_the_page(
    make_stack: Callable[..., Stack], tokenizer: Any, browser: Any
) -> None:
    """Four tool round trips of ~25k tokens each through the gateway: one
    prefix-merged trace of more than 100k tokens. The bound on the time to the
    first rendered chunk is generous (a loaded 2-core machine); the measured
    figures are printed and go in the issue's note."""
    outputs = ["".join(LINE.format(i=i, j=j) for j in range(1000)) for i in range(4)]
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "bash", "arguments": {"command": f"cat part{i}.txt"}}]}
        for i in range(4)
    ]
    stack = make_stack(
        {"turns": [*turns, {"text": "Read it all."}]},
        capture="token_in_token_out",
        engine={"max_model_len": 262144},
    )
    session = run_session(stack, outputs, "Read the four parts.")
    records = stack.records(session)
    trace = (
        PrefixMerge(BuildConfig(turns=TurnFormat.from_tokenizer(tokenizer)))
        .build(records)
        .traces[0]
    )
    total = len(trace.prompt_ids) + len(trace.response_ids)
    assert total > 100_000
    board = Dashboard(tokenizer, stores=(stack.db_path,))
    try:
        log_in(browser, board.url)
        console_errors(browser)
        browser.get(f"{board.url}/sessions/{session}/traces/0")
        token_view_ready(browser)
        ready_ms = int(browser.find_element(By.ID, "tokens").get_attribute("data-ready-at"))
        box = browser.find_element(By.ID, "tokens")
        assert int(box.get_attribute("data-total")) == total
        # Only what is near the viewport is in the page yet.
        assert int(box.get_attribute("data-rendered")) < total
        # Scrolling through it renders the rest, chunk by chunk, without a long task.
        assert browser.execute_script(WATCH_LONG_TASKS)
        # The watch sees a task that does hold the main thread (a 150 ms busy loop).
        browser.execute_script(BUSY)
        wait_for(lambda: browser.execute_script("return window.__longest") >= 150, "the busy loop")
        browser.execute_script("window.__longest = 0")
        scrolled = time.monotonic()
        render_all_tokens(browser, timeout_s=300)
        scroll_s = time.monotonic() - scrolled
        longest_task_ms = browser.execute_script("return window.__longest")
        count = browser.execute_script("return document.querySelectorAll('#tokens .t').length")
        trained = browser.execute_script("return document.querySelectorAll('#tokens .t.m1').length")
        print(
            f"100k trace: {total} tokens; first chunk shown {ready_ms} ms after navigation; "
            f"scrolled through all {total // 2000 + 1} chunks in {scroll_s:.1f} s, longest "
            f"main-thread task meanwhile {longest_task_ms:.0f} ms"
        )
        assert count == total
        assert trained == sum(trace.loss_mask)
        assert ready_ms < 30_000
        assert longest_task_ms < 5_000
        assert console_errors(browser) == []
    finally:
        browser.get("about:blank")
        board.close()
