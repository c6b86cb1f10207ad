"""Every dialect the gateway speaks, one line each: adding a dialect is a new
package under :mod:`polar.proxy.dialects` with its :class:`~.spec.DialectSpec`,
and its line here.

The gateway's app, the gateway group's router and the rollout side iterate
:data:`DIALECTS`; nothing else names a dialect. Nothing in the dialect packages
imports this module.
"""

from __future__ import annotations

from polar.ir import Dialect
from polar.proxy.dialects.anthropic_messages.dialect import DIALECT as ANTHROPIC_MESSAGES
from polar.proxy.dialects.gemini.dialect import DIALECT as GEMINI
from polar.proxy.dialects.openai_chat.dialect import DIALECT as OPENAI_CHAT
from polar.proxy.dialects.openai_responses.dialect import DIALECT as OPENAI_RESPONSES
from polar.proxy.dialects.spec import DialectSpec

DIALECTS: tuple[DialectSpec, ...] = (
    OPENAI_CHAT,
    ANTHROPIC_MESSAGES,
    OPENAI_RESPONSES,
    GEMINI,
)

DEFAULT = OPENAI_CHAT
"""Whose shape errors take at a path no dialect serves."""

_BY_NAME = {spec.name: spec for spec in DIALECTS}


def dialect_named(name: Dialect) -> DialectSpec:
    """The registered dialect ``name`` (``KeyError`` for one that is not)."""
    return _BY_NAME[name]


def dialect_at(path: str) -> DialectSpec:
    """The dialect serving ``path`` (:meth:`~.spec.DialectSpec.serves`), else :data:`DEFAULT`."""
    return next((spec for spec in DIALECTS if spec.serves(path)), DEFAULT)
