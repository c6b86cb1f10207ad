"""Plug-ins by name: a built-in's name, or any ``package.module:factory``.

Every variant Polar looks up by name (harnesses, runtime backends, evaluators,
trajectory builders, engines) is found here, so a typo reads the same
everywhere: one line naming the kind of plug-in, what was asked for, and what
would have worked. Each caller passes its own error class, so the failure
stays in its layer's error tree.

:func:`build` calls a factory with options as keyword arguments; a factory
that is a dataclass has the options checked against its fields first and
converted to their types (a command line's ``max_tokens=8000`` becomes
``8000``), so a wrong option is one clear line too.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from typing import Any

import pydantic

ErrorFactory = Callable[[str], Exception]
"""Turns a one-line message into the caller's own error."""


def load_factory(
    ref: str, *, kind: str, known: Mapping[str, object], error: ErrorFactory
) -> Callable[..., Any]:
    """The factory ``ref`` names: a key of ``known`` or ``package.module:attribute``.

    A value of ``known`` is either the factory itself or its dotted path
    (imported only when asked for, so a built-in's dependencies load lazily).
    ``kind`` names the plug-in in messages (``harness``, ``evaluator``...).
    """
    entry = known.get(ref, ref)
    if not isinstance(entry, str):
        if not callable(entry):
            raise error(f"{kind} {ref}: the built-in is not callable")
        return entry
    module_name, _, attr = entry.partition(":")
    if not module_name or not attr:
        raise error(
            f"unknown {kind} {ref!r}; use one of {sorted(known)} or 'package.module:factory'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise error(f"{kind} {ref}: cannot import {module_name} ({exc})") from None
    factory: object = getattr(module, attr, None)
    if not callable(factory):
        raise error(f"{kind} {ref}: {module_name} has no callable {attr!r}")
    return factory


def build(
    factory: Callable[..., Any],
    options: Mapping[str, Any],
    *,
    label: str,
    noun: str,
    error: ErrorFactory,
) -> object:
    """``factory(**options)``; a dataclass factory validates ``options`` against its
    fields first. ``label`` starts every message (``harness pi``), ``noun`` names
    the options in it (``options``, ``config``). Errors the factory raises itself,
    other than a validation or argument error, pass through unchanged."""
    try:
        if dataclasses.is_dataclass(factory) and isinstance(factory, type):
            fields = {field.name for field in dataclasses.fields(factory) if field.init}
            unknown = sorted(set(options) - fields)
            if unknown:
                raise error(
                    f"{label}: unknown {noun} {unknown}; it takes {sorted(fields) or 'none'}"
                )
            return pydantic.TypeAdapter(factory).validate_python(dict(options))
        return factory(**options)
    except pydantic.ValidationError as exc:
        raise error(f"{label}: {_first_problem(exc, noun)}") from None
    except TypeError as exc:
        raise error(f"{label}: {exc}") from None


def _first_problem(exc: pydantic.ValidationError, noun: str) -> str:
    errors = exc.errors()
    first = errors[0]
    where = ".".join(str(part) for part in first["loc"]) or noun
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {first['msg']}{more}"
