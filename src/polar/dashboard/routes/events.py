"""``/api/events``: the rollout server's event stream relayed to the browser
as it comes (:meth:`DashboardService.events`), unbuffered by proxies."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from polar.dashboard.routes.guard import params
from polar.dashboard.service import DashboardService


async def events_api(request: Request, dashboard: DashboardService) -> Response:
    params(request)
    return StreamingResponse(
        dashboard.events(),
        media_type="text/event-stream",
        headers={"x-accel-buffering": "no"},
    )
