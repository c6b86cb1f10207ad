"""Small descriptive statistics helpers."""

from statkit.summary import mean, median

__all__ = ["mean", "median"]
