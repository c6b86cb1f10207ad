"""The trajectory layer's errors: one tree, each phrased for a one-line message."""

from __future__ import annotations


class TrajectoryError(Exception):
    """Base of every error the trajectory layer raises on purpose."""


class UnknownBuilder(TrajectoryError):
    """A builder name or ``module:Class`` path that does not resolve to a builder."""


class BuildInputError(TrajectoryError):
    """Records or configuration a builder cannot work from (mixed sessions, bad rules)."""


class ExportError(TrajectoryError):
    """A sample file that cannot be written, or read back."""
