"""The harness layer's error tree: every failure a caller can act on is one of these."""

from __future__ import annotations


class HarnessError(Exception):
    """Base of the harness errors; the message is one line, fit for a CLI."""


class UnknownHarness(HarnessError):
    """No preset by that name, or a dotted path that does not lead to a harness."""


class InvalidHarnessOptions(HarnessError):
    """Options a harness factory does not accept, or values it rejects."""


class InvalidRunSpec(HarnessError):
    """A run description that cannot be run (bad URL, missing workdir, ...)."""


class InstallError(HarnessError):
    """Installing a harness CLI into the cache failed."""
