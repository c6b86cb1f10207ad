"""Interval arithmetic."""

from spans.merge import merge

__all__ = ["merge"]
