"""The dashboard's pages and the fragments its script swaps in live.

Every string that came from an agent, a harness, a task file or a server is
escaped (:func:`polar.dashboard.html.esc`); ids in links are quoted. No page
carries inline script or style (the Content-Security-Policy forbids both).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from polar.dashboard.html import esc, link, number, page, seconds, status, table, url, when
from polar.dashboard.sources import StoredSession
from polar.dashboard.tokens import Built, drift_of
from polar.ir import CompletionRecord, RecordStatus
from polar.rollout.protocol import SessionResult, SessionView, TaskResult, TaskStatus, TaskView

STAGES = ("queued", "preparing", "ready", "running", "building", "evaluating")


def login(error: str | None = None) -> str:
    note = f'<p class="error">{esc(error)}</p>' if error else ""
    form = (
        '<form method="post" action="/login" class="login">'
        '<label>Control token <input type="password" name="token" autocomplete="off" '
        'required autofocus></label><button type="submit">Log in</button></form>'
    )
    return page("Log in", note + form, nav=False)


def error(status_code: int, message: str) -> str:
    return page(f"Error {status_code}", f'<p class="error">{esc(message)}</p>')


# ---------------------------------------------------------------- tasks and groups


def tasks_page(fragment: str, *, live: bool) -> str:
    if not live:
        return page("Tasks", fragment)
    body = (
        '<p class="live"><span id="live-state">connecting…</span></p>'
        f'<div data-live="/fragments/tasks">{fragment}</div>'
    )
    return page("Tasks", body)


def tasks_fragment(views: Sequence[TaskView], problem: str | None = None) -> str:
    if problem is not None:
        return f'<p class="error">{esc(problem)}</p>'
    if not views:
        return '<p class="empty">No tasks yet.</p>'
    groups: dict[str, list[TaskView]] = defaultdict(list)
    for view in views:
        groups[view.group_id].append(view)
    parts = []
    for group_id, members in groups.items():
        rows = [
            [
                link(url("tasks", v.task_id), v.task_id),
                esc(v.task),
                esc(v.harness),
                status(v.status),
                esc(", ".join(f"{k} {n}" for k, n in sorted(v.counts.items()))),
                number(v.mean_reward),
                when(v.created_at),
                seconds(v.finished_at - v.created_at if v.finished_at else None),
            ]
            for v in members
        ]
        headers = ("task", "dataset task", "harness", "status", "sessions", "mean reward")
        parts.append(
            f'<section class="group"><h2>group {esc(group_id)}</h2>'
            + table((*headers, "submitted", "took"), rows, cls="tasks")
            + "</section>"
        )
    return "".join(parts)


def task_page(task_id: str, fragment: str) -> str:
    body = (
        '<p class="live"><span id="live-state">connecting…</span></p>'
        f'<div data-live="{esc(url("fragments", "tasks", task_id))}">{fragment}</div>'
    )
    return page(f"Task {task_id}", body)


def task_fragment(view: TaskView, result: TaskResult | None) -> str:
    results = {r.session_id: r for r in result.results} if result else {}
    cancel = (
        f'<button class="cancel" data-cancel="{esc(view.task_id)}">Cancel task</button>'
        '<span class="cancel-state"></span>'
        if view.status is TaskStatus.RUNNING
        else ""
    )
    facts = table(
        ("status", "group", "dataset task", "harness", "samples", "mean reward", "callback"),
        [
            [
                status(view.status),
                esc(view.group_id),
                esc(view.task),
                esc(view.harness),
                esc(view.num_samples),
                number(view.mean_reward),
                esc(view.callback_error or "—"),
            ]
        ],
        cls="facts",
    )
    rows = [_session_row(s, results.get(s.session_id)) for s in view.sessions]
    sessions = table(
        ("sample", "session", "status", "node", "reward", *STAGES, "error"), rows, cls="sessions"
    )
    return (
        f'<div class="task" data-status="{esc(view.status.value)}">{facts}{cancel}{sessions}</div>'
    )


def _session_row(view: SessionView, result: SessionResult | None) -> list[str]:
    timings = result.timings if result else {}
    error = view.error or (result.error if result else None) or ""
    replaced = f" (replaced by {view.replaced_by})" if view.replaced_by else ""
    return [
        esc(view.sample_index),
        link(url("sessions", view.session_id), view.session_id),
        status(view.status),
        esc(view.node_id or "—"),
        number(view.reward),
        *(seconds(timings.get(stage)) for stage in STAGES),
        f'<span class="clip">{esc(error + replaced)}</span>',
    ]


# ---------------------------------------------------------------- sessions


SESSIONS_SHOWN = 500


def sessions_page(stored: Sequence[StoredSession]) -> str:
    if not stored:
        return page("Sessions", '<p class="empty">No sessions in the record stores.</p>')
    newest = sorted(stored, key=lambda s: s.row.created_at, reverse=True)[:SESSIONS_SHOWN]
    note = (
        f'<p class="note">the newest {SESSIONS_SHOWN} of {len(stored)} sessions</p>'
        if len(stored) > SESSIONS_SHOWN
        else ""
    )
    rows = [
        [
            link(url("sessions", s.row.id), s.row.id),
            esc(s.row.last_seq),
            when(s.row.created_at),
            when(s.row.closed_at) if s.row.closed_at else status("open"),
            esc(s.store.path),
        ]
        for s in newest
    ]
    return page("Sessions", note + table(("session", "calls", "opened", "closed", "store"), rows))


def session_page(
    session_id: str,
    result: SessionResult | None,
    built: Built | None,
    problem: str | None,
    conversation: dict[str, Any] | None,
    shown: int | None,
) -> str:
    parts = [_result_summary(result)]
    if problem:
        parts.append(f'<p class="error">{esc(problem)}</p>')
    if built is not None:
        parts.append(_traces(session_id, built, shown))
        left = _conversation(conversation) if conversation else ""
        parts.append(
            f'<div class="split"><section class="conversation"><h2>Conversation</h2>{left}'
            f'</section><section class="calls"><h2>Recorded calls</h2>{_calls(built)}'
            "</section></div>"
        )
    return page(f"Session {session_id}", "".join(parts))


def _result_summary(result: SessionResult | None) -> str:
    if result is None:
        return '<p class="empty">No result from the rollout server for this session.</p>'
    accounting = result.accounting
    tokens = (
        f"{accounting.delivered} of {accounting.captured} generated tokens delivered"
        if accounting
        else "no trajectory built"
    )
    return table(
        ("status", "reward", "resolved", "node", *STAGES, "tokens", "error"),
        [
            [
                status(result.status),
                number(result.reward),
                esc(result.resolved),
                esc(result.node_id or "—"),
                *(seconds(result.timings.get(stage)) for stage in STAGES),
                esc(tokens),
                f'<span class="clip">{esc(result.error or "")}</span>',
            ]
        ],
        cls="facts",
    )


def _traces(session_id: str, built: Built, shown: int | None) -> str:
    trajectory = built.trajectory
    rows = []
    for index, trace in enumerate(trajectory.traces):
        chain = trajectory.chains[trace.chain]
        rows.append(
            [
                link(url("sessions", session_id, "traces", str(index)), trace.id),
                esc(f"{trace.chain} ({chain.chain_class.value})"),
                esc(trace.segment),
                esc(trace.break_reason.value if trace.break_reason else "—"),
                esc("yes" if trace.trainable else "no"),
                esc(trace.tokens),
                esc(sum(trace.loss_mask)),
                esc(trace.policy_version),
                link(f"?trace={index}", "shown" if index == shown else "show"),
            ]
        )
    accounting = trajectory.accounting
    summary = (
        f"{trajectory.builder}: {len(trajectory.chains)} chain(s), "
        f"{accounting.delivered} of {accounting.captured} generated tokens delivered"
    )
    headers = ("trace (token view)", "chain", "segment", "break", "trained", "tokens")
    return f"<h2>Traces</h2><p>{esc(summary)}</p>" + table(
        (*headers, "trained tokens", "policy", "conversation"), rows, cls="traces"
    )


def _conversation(conversation: dict[str, Any]) -> str:
    if conversation.get("problem"):
        return f'<p class="error">{esc(conversation["problem"])}</p>'
    parts = [f'<p class="note">trace {esc(conversation["trace_id"])}</p>']
    for message in conversation["messages"]:
        role = str(message.get("role", "?"))
        inner = []
        if message.get("reasoning_content"):
            inner.append(f'<pre class="reasoning">{esc(message["reasoning_content"])}</pre>')
        content = message.get("content")
        if isinstance(content, str) and content:
            inner.append(f'<pre class="content">{esc(content)}</pre>')
        elif content:
            inner.append(f'<pre class="content">{esc(json.dumps(content, indent=1))}</pre>')
        for call in message.get("tool_calls") or ():
            function = call.get("function", {})
            inner.append(
                f'<pre class="tool-call">{esc(function.get("name"))}'
                f"({esc(function.get('arguments'))})</pre>"
            )
        name = f" · {message['tool_call_id']}" if message.get("tool_call_id") else ""
        parts.append(
            f'<article class="message role-{esc(role)}"><h3>{esc(role)}{esc(name)}</h3>'
            f"{''.join(inner)}</article>"
        )
    return "".join(parts)


def _calls(built: Built) -> str:
    drift = drift_of(built.trajectory)
    rows = [_call_row(record, drift) for record in built.records]
    return table(
        ("call", "status", "policy", "lineage", "builder", "timings", "tokens", "edits, flags"),
        rows,
        cls="calls",
    )


def _call_row(record: CompletionRecord, drift: dict[str, Any]) -> list[str]:
    t = record.timings
    spans = []
    if t.engine_started is not None:
        spans.append(f"queue {t.engine_started - t.arrived:.3f}s")
    if t.first_token is not None:
        spans.append(f"first token {t.first_token - t.arrived:.3f}s")
    if t.finished is not None:
        spans.append(f"total {t.finished - t.arrived:.3f}s")
    lineage = record.lineage
    lineage_text = (
        f"{lineage.origin.value}"
        + (f" of #{lineage.base_seq}, {lineage.shared_tokens}/{lineage.base_tokens}")
        * (lineage.base_seq is not None)
        + (" spliced" if lineage.spliced else "")
        if lineage
        else "—"
    )
    turn = drift.get(record.key)
    builder = (
        f"{turn.relation.value}" + (f" of {turn.parent}" if turn.parent else "") if turn else "—"
    )
    notes = [f"{e.kind.value}: {e.detail}" for e in record.edits]
    notes += [f"{f.issue.value}: {f.detail}" for f in record.delivery_flags]
    notes += [f"malformed tool call: {m.reason}" for m in record.malformed_tool_calls]
    if record.error:
        notes.append(f"{record.error.kind.value}: {record.error.message}")
    said = record.message.preview() if record.message is not None else ""
    if said and record.status is not RecordStatus.COMPLETED:
        notes.append(f"sampled before it ended: {said}")  # an aborted call's text
    return [
        esc(f"#{record.seq}.{record.attempt}"),
        status(record.status),
        esc(record.policy_version),
        esc(lineage_text),
        esc(builder),
        esc(", ".join(spans) or "—"),
        esc(f"{len(record.prompt_ids)} in, {len(record.output_ids)} out"),
        f'<span class="clip">{esc("; ".join(notes) or "—")}</span>',
    ]


def token_page(session_id: str, index: int, built: Built) -> str:
    trajectory = built.trajectory
    trace = trajectory.traces[index]
    others = " ".join(
        link(url("sessions", session_id, "traces", str(i)), t.id) if i != index else esc(t.id)
        for i, t in enumerate(trajectory.traces)
    )
    legend = (
        '<p class="legend"><span class="t m1">trained</span> <span class="t m0">not trained'
        "</span> · underline: logprob (green: likely, red: unlikely; dashed: none) · "
        '<span class="mk mk-turn">call</span> <span class="mk mk-break">break</span> '
        '<span class="mk mk-drift">drift</span></p>'
    )
    brk = trace.break_reason.value if trace.break_reason else "—"
    head = (
        f"<p>{link(url('sessions', session_id), 'back to the session')} · traces: {others}</p>"
        f'<p class="note">chain {esc(trace.chain)} ({esc(trace.chain_class.value)}), segment '
        f"{esc(trace.segment)}, break {esc(brk)}"
        f", {'trained' if trace.trainable else 'not trained (its class is not trained)'}</p>"
    )
    src = url("api", "sessions", session_id, "traces", str(index), "tokens")
    view = (
        f'<p id="token-summary" class="note">loading…</p>'
        f'<div id="tokens" data-src="{esc(src)}" data-state="loading"></div>'
        '<div id="tip" hidden></div>'
    )
    return page(f"Trace {trace.id}", head + legend + view)
