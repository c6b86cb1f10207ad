"""Bounded text for logs and error messages.

A request body or an engine reply can be megabytes, and a ``repr`` of a
deeply nested one can itself fail. Anything that quotes data the gateway did
not write goes through these, so a log line or an error message stays one
short line whatever came in.
"""

from __future__ import annotations

import reprlib

LIMIT = 300

_repr = reprlib.Repr()
_repr.maxlevel = 3
_repr.maxstring = 80
_repr.maxother = 80
_repr.maxlist = _repr.maxdict = _repr.maxtuple = _repr.maxset = 6


def clip(text: str, limit: int = LIMIT) -> str:
    """``text`` cut to ``limit`` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def describe(error: BaseException, limit: int = LIMIT) -> str:
    """``Type: message`` of an exception, bounded (never raises)."""
    try:
        message = str(error)
    except Exception:  # a broken __str__, or one that recurses
        message = "<message could not be rendered>"
    return clip(f"{type(error).__name__}: {message}" if message else type(error).__name__, limit)


def brief(value: object) -> str:
    """A short ``repr`` of any value, however large or deep (never raises)."""
    try:
        return clip(_repr.repr(value))
    except Exception:
        return f"<{type(value).__name__}>"
