"""Building HTML safely: every value goes through :func:`esc`; markup is only ever
the constants of :mod:`polar.dashboard.pages` joined around escaped values."""

from __future__ import annotations

import html
import time
from collections.abc import Iterable
from urllib.parse import quote


def esc(value: object) -> str:
    """Text for an element or a quoted attribute (quotes escaped too)."""
    return html.escape("" if value is None else str(value), quote=True)


def url(*parts: str) -> str:
    """A path of escaped segments (ids come from agents' and users' input)."""
    return "/" + "/".join(quote(part, safe="") for part in parts)


def link(href: str, text: object) -> str:
    return f'<a href="{esc(href)}">{esc(text)}</a>'


def table(headers: Iterable[str], rows: Iterable[Iterable[str]], *, cls: str = "") -> str:
    """A table of cells that are already HTML (escape values before)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{esc(cls)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def status(value: object) -> str:
    text = esc(getattr(value, "value", value))
    return f'<span class="status status-{text}">{text}</span>'


def number(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else esc(f"{value:.{digits}g}")


def seconds(value: float | None) -> str:
    if value is None:
        return "—"
    return esc(f"{value:.2f} s" if value < 100 else f"{value:.0f} s")


def when(epoch: float | None) -> str:
    if epoch is None:
        return "—"
    return esc(time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch)))


def page(title: str, body: str, *, nav: bool = True) -> str:
    menu = (
        '<nav><a href="/">Tasks</a><a href="/sessions">Sessions</a>'
        '<a href="/training">Training</a>'
        '<form method="post" action="/logout"><button type="submit">Log out</button></form></nav>'
        if nav
        else ""
    )
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} · Polar</title>"
        '<link rel="stylesheet" href="/static/dashboard.css">'
        '<script src="/static/dashboard.js" defer></script>'
        f"</head><body><header><strong>Polar</strong>{menu}</header>"
        f"<main><h1>{esc(title)}</h1>{body}</main></body></html>"
    )
