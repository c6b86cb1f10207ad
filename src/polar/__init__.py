"""Polar: reinforcement learning for unmodified coding-agent harnesses.

The package is split into parts with one-way imports (see docs/architecture.md):
``ir`` <- ``proxy`` / ``trajectory`` <- ``rollout`` <- ``train`` / ``sft`` / ``cli``.
"""

__version__ = "0.1.0"
