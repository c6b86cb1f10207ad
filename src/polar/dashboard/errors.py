"""The dashboard's errors: each carries the status it is answered with and one
line the page or the JSON error shows as it is (:mod:`polar.dashboard.routes.guard`
maps them)."""

from __future__ import annotations


class DashboardError(Exception):
    """Answered with ``status`` and ``message``, on an error page or in JSON."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class BadRequest(DashboardError):
    """The request is wrong (a query parameter, a missing header): 400 or 403,
    answered as ``invalid_request``."""
