"""The training page: curves from the trainer's metrics log (SVG drawn on the
server) and an SFT generation's acceptance statistics."""

from __future__ import annotations

from typing import Any

from polar.dashboard.html import esc, number, page, table
from polar.dashboard.sources import TrainingLog

CURVES = (
    ("Reward", ("reward/mean", "eval/reward_mean")),
    ("Zero-advantage fraction", ("groups/zero_advantage_fraction",)),
    ("KL", ("mismatch/kl", "loss/kl")),
    ("Staleness", ("staleness/mean", "staleness/max")),
)
WIDTH, HEIGHT, PAD, LEFT = 560, 180, 36, 64


def training_page(fragment: str) -> str:
    return page("Training", f'<div data-poll="/fragments/training">{fragment}</div>')


def training_fragment(
    metrics: TrainingLog | None,
    metrics_problem: str | None,
    sft: dict[str, Any] | None,
    sft_problem: str | None,
    configured: tuple[bool, bool],
) -> str:
    parts = ["<h2>Trainer</h2>"]
    if metrics_problem:
        parts.append(f'<p class="error">{esc(metrics_problem)}</p>')
    elif metrics is None:
        parts.append(
            '<p class="empty">'
            + ("No metrics log yet." if configured[0] else "No trainer log given (--metrics).")
            + "</p>"
        )
    else:
        note = f"{len(metrics.rows)} steps from {metrics.path}"
        if metrics.unreadable:
            note += f"; {metrics.unreadable} line(s) unreadable"
        parts.append(f'<p class="note">{esc(note)}</p><div class="charts">')
        for title, names in CURVES:
            parts.append(chart(title, [(name, metrics.series(name)) for name in names]))
        parts.append("</div>")
    parts.append("<h2>SFT generation</h2>")
    if sft_problem:
        parts.append(f'<p class="error">{esc(sft_problem)}</p>')
    elif sft is None:
        parts.append(
            '<p class="empty">'
            + ("No statistics yet." if configured[1] else "No SFT statistics given (--sft).")
            + "</p>"
        )
    else:
        parts.append(sft_table(sft))
    return "".join(parts)


def chart(title: str, series: list[tuple[str, list[tuple[float, float]]]]) -> str:
    drawn = [(name, points) for name, points in series if points]
    if not drawn:
        return (
            f'<figure class="chart"><figcaption>{esc(title)}</figcaption>'
            '<p class="empty">not in the log</p></figure>'
        )
    xs = [x for _, points in drawn for x, _ in points]
    ys = [y for _, points in drawn for _, y in points]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y0, y1 = y0 - 0.5, y1 + 0.5

    def sx(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * (WIDTH - LEFT - PAD)

    def sy(y: float) -> float:
        return HEIGHT - PAD + (y - y0) / (y1 - y0) * (2 * PAD - HEIGHT)

    lines = []
    legend = []
    for k, (name, points) in enumerate(drawn):
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points)
        lines.append(f'<polyline class="series s{k}" fill="none" points="{path}"/>')
        dots = "".join(
            f'<circle class="series s{k}" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2"/>'
            for x, y in points[-200:]
        )
        lines.append(dots)
        legend.append(f'<span class="key s{k}">{esc(name)} (last {number(points[-1][1])})</span>')
    bottom = HEIGHT - PAD
    axes = (
        f'<line class="axis" x1="{LEFT}" y1="{bottom}" x2="{WIDTH - PAD}" y2="{bottom}"/>'
        f'<line class="axis" x1="{LEFT}" y1="{PAD}" x2="{LEFT}" y2="{HEIGHT - PAD}"/>'
        f'<text x="{LEFT - 4}" y="{PAD + 4}" text-anchor="end">{number(y1)}</text>'
        f'<text x="{LEFT - 4}" y="{HEIGHT - PAD}" text-anchor="end">{number(y0)}</text>'
        f'<text x="{LEFT}" y="{HEIGHT - PAD + 16}">step {number(x0, 6)}</text>'
        f'<text x="{WIDTH - PAD}" y="{HEIGHT - PAD + 16}" text-anchor="end">{number(x1, 6)}</text>'
    )
    return (
        f'<figure class="chart"><figcaption>{esc(title)}</figcaption>'
        f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{esc(title)}">'
        f"{axes}{''.join(lines)}</svg><p>{' '.join(legend)}</p></figure>"
    )


def sft_table(stats: dict[str, Any]) -> str:
    def row(name: str, tally: Any) -> list[str]:
        tally = tally if isinstance(tally, dict) else {}
        rejected = tally.get("rejected") if isinstance(tally.get("rejected"), dict) else {}
        filtered = tally.get("filtered") if isinstance(tally.get("filtered"), dict) else {}
        rate = tally.get("rate")
        return [
            esc(name),
            esc(tally.get("planned")),
            esc(tally.get("attempts")),
            esc(tally.get("accepted")),
            number(rate if isinstance(rate, int | float) else None),
            esc(", ".join(f"{k} {v}" for k, v in rejected.items() if v) or "—"),
            esc(", ".join(f"{k} {v}" for k, v in filtered.items() if v) or "—"),
        ]

    rows = [row("overall", stats["overall"])]
    rows += [row(str(t.get("task", "?")), t) for t in stats["tasks"] if isinstance(t, dict)]
    state = "complete" if stats.get("complete") else "in progress"
    return f'<p class="note">{esc(state)}; accept: {esc(stats.get("accept"))}</p>' + table(
        ("task", "planned", "attempts", "accepted", "rate", "rejected", "filtered"),
        rows,
        cls="sft",
    )
