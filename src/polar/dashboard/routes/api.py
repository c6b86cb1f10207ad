"""The JSON API (``/api/…``): the task list, a task's cancel (the dashboard's
one write) and a trace's tokens for the token view.

Cancel also wants the ``x-polar-dashboard`` header: a cross-site form cannot
set one, and the app answers no CORS preflight, so another site cannot cancel
through a logged-in browser.
"""

from __future__ import annotations

import orjson
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from polar.dashboard.errors import BadRequest
from polar.dashboard.routes.guard import params, status_param
from polar.dashboard.service import DashboardService
from polar.dashboard.tokens import token_view

CSRF_HEADER = "x-polar-dashboard"


async def tasks_api(request: Request, dashboard: DashboardService) -> Response:
    wanted = status_param(request)
    views = await dashboard.require_rollout().tasks(wanted)
    return JSONResponse([v.model_dump(mode="json") for v in views])


async def cancel_api(request: Request, dashboard: DashboardService) -> Response:
    params(request)
    if request.headers.get(CSRF_HEADER) != "1":
        raise BadRequest(403, f"cancel wants the {CSRF_HEADER} header")
    view = await dashboard.require_rollout().cancel(request.path_params["task_id"])
    return Response(view.model_dump_json(), media_type="application/json")


async def tokens_api(request: Request, dashboard: DashboardService) -> Response:
    params(request)
    session_id = request.path_params["session_id"]
    built, index = await dashboard.trace(session_id, request.path_params["index"])
    data = await run_in_threadpool(token_view, dashboard.trajectories, built, index)
    return Response(orjson.dumps(data), media_type="application/json")
