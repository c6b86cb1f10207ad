"""What an aborted call had sampled is shown on its session's page (no browser)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import httpx

from polar.ir import (
    CallError,
    ErrorKind,
    Message,
    ReasoningPart,
    RecordStatus,
    Role,
    TextPart,
)

from support.dashboard import TOKEN, Dashboard, fill_store, recorded_sessions

SESSION = "pi.token_in_token_out"


def test_the_text_of_an_aborted_call_is_on_its_sessions_page(
    tmp_path: Path, tokenizer: Any
) -> None:
    records = recorded_sessions()[SESSION]
    last = records[-1]
    aborted = dataclasses.replace(
        last,
        seq=last.seq + 1,
        attempt=1,
        status=RecordStatus.ABORTED,
        finish_reason=None,
        message=Message(
            role=Role.ASSISTANT,
            parts=(ReasoningPart(text="Check <b>it</b>."), TextPart(text="Running the te")),
        ),
        error=CallError(
            kind=ErrorKind.SESSION_ENDED,
            message="the session's harness ended while the call was in flight",
        ),
    )
    store = tmp_path / "records.db"
    fill_store(store, {SESSION: [*records, aborted]})
    board = Dashboard(tokenizer, stores=(store,))
    try:
        page = httpx.get(
            f"{board.url}/sessions/{SESSION}", headers={"authorization": f"Bearer {TOKEN}"}
        )
    finally:
        board.close()

    assert page.status_code == 200
    assert (
        "sampled before it ended: reasoning=&quot;Check &lt;b&gt;it&lt;/b&gt;.&quot; "
        "text=&quot;Running the te&quot;" in page.text
    )
    assert page.text.count("sampled before it ended") == 1, "completed calls show no note"
