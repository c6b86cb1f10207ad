"""The web dashboard (``polar dashboard``): rollouts and training, live, and every
trajectory token by token.

A Starlette app (:mod:`~polar.dashboard.app`: one
:class:`~polar.dashboard.service.DashboardService` in ``app.state``, the handlers
in :mod:`~polar.dashboard.routes`) over three read-only sources
(:mod:`~polar.dashboard.sources`): the rollout server's API (tasks, groups,
results, its SSE event stream; the one write is a task's cancel), the gateway
record stores (a session's calls, from which its trajectory is built again with
the same builders a node uses) and the trainer's and SFT generation's files.
Pages are rendered on the server (:mod:`~polar.dashboard.pages`, every string
escaped); a small script shipped with the package (``static/dashboard.js``)
follows the event stream, swaps in fresh fragments and renders the token view
in chunks (:mod:`~polar.dashboard.tokens` serves its data). Nothing is loaded
from anywhere but the dashboard itself.
"""

from polar.dashboard.app import create_dashboard_app
from polar.dashboard.config import DashboardConfig

__all__ = ["DashboardConfig", "create_dashboard_app"]
