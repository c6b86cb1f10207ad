"""Acceptance rules: which scored attempts are kept (``--accept 'reward >= 1'``).

A rule is a small expression over what the evaluator said of a session:
``reward`` (a number) and ``resolved`` (true or false; false when the evaluator
did not say). It may use numbers, ``true``/``false`` (or ``True``/``False``),
comparisons (``<``, ``<=``, ``>``, ``>=``, ``==``, ``!=``, chained as in
Python), ``and``, ``or``, ``not`` and parentheses; nothing else. Examples:
``reward >= 1``, ``resolved``, ``reward > 0.5 and not resolved``,
``0.2 <= reward < 0.8``.

It is parsed with Python's own parser and evaluated by walking the tree here,
never by ``eval``: a rule cannot call, index, or reach anything.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

NAMES = ("reward", "resolved")
_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], bool]] = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}
_CONSTANTS = {"true": True, "false": False, "True": True, "False": False}


class AcceptError(ValueError):
    """A rule that is not a valid acceptance expression (the message says where)."""


@dataclass(frozen=True, slots=True)
class Acceptance:
    """A parsed rule; call it with a session's ``reward`` and ``resolved``."""

    text: str
    tree: ast.expr

    @classmethod
    def parse(cls, text: str) -> Acceptance:
        try:
            tree = ast.parse(text.strip(), mode="eval").body
        except SyntaxError:
            raise AcceptError(f"--accept {text!r}: not an expression") from None
        _check(tree, text)
        return cls(text, tree)

    def __call__(self, reward: float, resolved: bool | None) -> bool:
        return bool(_value(self.tree, {"reward": reward, "resolved": bool(resolved)}))


def _check(node: ast.expr, text: str) -> None:
    match node:
        case ast.BoolOp(values=values):
            for value in values:
                _check(value, text)
        case ast.UnaryOp(op=ast.Not() | ast.USub(), operand=operand):
            _check(operand, text)
        case ast.Compare(left=left, ops=ops, comparators=rights):
            for op in ops:
                if type(op) not in _COMPARE:
                    raise AcceptError(f"--accept {text!r}: unsupported comparison {_show(op)}")
            for side in (left, *rights):
                _check(side, text)
        case ast.Name(id=name):
            if name not in NAMES and name not in _CONSTANTS:
                raise AcceptError(
                    f"--accept {text!r}: unknown name {name!r} (use {' or '.join(NAMES)})"
                )
        case ast.Constant(value=value):
            if isinstance(value, str) or not isinstance(value, int | float):
                raise AcceptError(f"--accept {text!r}: only numbers and true/false are allowed")
        case _:
            raise AcceptError(f"--accept {text!r}: {_show(node)} is not allowed")


def _show(node: ast.AST) -> str:
    return type(node).__name__.lower()


def _value(node: ast.expr, names: dict[str, Any]) -> Any:
    match node:
        case ast.BoolOp(op=ast.And(), values=values):
            return all(_value(v, names) for v in values)
        case ast.BoolOp(values=values):
            return any(_value(v, names) for v in values)
        case ast.UnaryOp(op=ast.Not(), operand=operand):
            return not _value(operand, names)
        case ast.UnaryOp(operand=operand):
            return -_value(operand, names)
        case ast.Compare(left=left, ops=ops, comparators=rights):
            current = _value(left, names)
            for op, right in zip(ops, rights, strict=True):
                other = _value(right, names)
                if not _COMPARE[type(op)](current, other):
                    return False
                current = other
            return True
        case ast.Name(id=name):
            return names[name] if name in names else _CONSTANTS[name]
        case ast.Constant(value=value):
            return value
    raise AssertionError(f"unchecked node {node!r}")
