"""The pages (``/``, ``/tasks/…``, ``/sessions…``, ``/training``) and the
fragments of them the script swaps in as events come (``/fragments/…``).

Everything is rendered on the server by :mod:`polar.dashboard.pages` and
:mod:`polar.dashboard.training`. A task list whose server does not answer
shows why in place of the list; an unknown task or session is a 404.
"""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from polar.dashboard import pages, training
from polar.dashboard.config import DashboardConfig
from polar.dashboard.errors import BadRequest
from polar.dashboard.routes.guard import params, status_param
from polar.dashboard.service import DashboardService
from polar.dashboard.sources import SourceError, read_metrics, read_sft_stats, valid_id
from polar.dashboard.tokens import Built
from polar.rollout.conversation import conversation_json
from polar.rollout.protocol import TaskStatus
from polar.trajectory import ChainClass

# ------------------------------------------------------------ tasks


async def tasks_page(request: Request, dashboard: DashboardService) -> Response:
    fragment = await _tasks_html(dashboard, status_param(request))
    return HTMLResponse(pages.tasks_page(fragment, live=dashboard.rollout is not None))


async def tasks_fragment(request: Request, dashboard: DashboardService) -> Response:
    return HTMLResponse(await _tasks_html(dashboard, status_param(request)))


async def task_page(request: Request, dashboard: DashboardService) -> Response:
    params(request)
    task_id = request.path_params["task_id"]
    return HTMLResponse(pages.task_page(task_id, await _task_html(dashboard, task_id)))


async def task_fragment(request: Request, dashboard: DashboardService) -> Response:
    params(request)
    return HTMLResponse(await _task_html(dashboard, request.path_params["task_id"]))


async def _tasks_html(dashboard: DashboardService, wanted: TaskStatus | None) -> str:
    source = dashboard.rollout
    if source is None:
        return pages.tasks_fragment([], "No rollout server given (--server).")
    try:
        return pages.tasks_fragment(await source.tasks(wanted))
    except SourceError as exc:
        return pages.tasks_fragment([], exc.message)


async def _task_html(dashboard: DashboardService, task_id: str) -> str:
    source = dashboard.rollout
    view = await source.task(task_id) if source else None
    if source is None or view is None:
        raise SourceError(404, f"no task {task_id}")
    result = await source.result(task_id) if view.status is not TaskStatus.RUNNING else None
    return pages.task_fragment(view, result)


# ------------------------------------------------------------ sessions


async def sessions_page(request: Request, dashboard: DashboardService) -> Response:
    params(request)
    stored = await run_in_threadpool(dashboard.records.sessions)
    return HTMLResponse(pages.sessions_page(stored))


async def session_page(request: Request, dashboard: DashboardService) -> Response:
    raw = params(request, frozenset({"trace"})).get("trace")
    session_id = request.path_params["session_id"]
    if not valid_id(session_id):
        raise SourceError(404, f"no session {session_id}")
    result = await dashboard.session_result(session_id)
    built, problem = await dashboard.load_session(session_id)
    if built is None and result is None and problem is None:
        raise SourceError(404, f"no session {session_id}")
    shown: int | None = None
    conversation = None
    if built is not None and built.trajectory.traces:
        shown = _index(raw, len(built.trajectory.traces), default=_main_last(built))
        conversation = await run_in_threadpool(
            conversation_json, built.trajectory.traces[shown], built.by_key
        )
    elif raw is not None:
        raise BadRequest(400, "this session has no traces to show")
    return HTMLResponse(pages.session_page(session_id, result, built, problem, conversation, shown))


async def token_page(request: Request, dashboard: DashboardService) -> Response:
    params(request)
    session_id = request.path_params["session_id"]
    built, index = await dashboard.trace(session_id, request.path_params["index"])
    return HTMLResponse(pages.token_page(session_id, index, built))


def _index(raw: str | None, count: int, *, default: int) -> int:
    if raw is None:
        return default
    if not raw.isdigit() or int(raw) >= count:
        raise BadRequest(400, f"trace must be a number from 0 to {count - 1}, not {raw!r}")
    return int(raw)


def _main_last(built: Built) -> int:
    """The last trace of the main chain (the agent's conversation as it ended)."""
    traces = built.trajectory.traces
    chains = built.trajectory.chains
    main = [i for i, t in enumerate(traces) if chains[t.chain].chain_class is ChainClass.MAIN]
    return main[-1] if main else len(traces) - 1


# ------------------------------------------------------------ training


async def training_page(request: Request, dashboard: DashboardService) -> Response:
    params(request)
    fragment = await run_in_threadpool(_training_html, dashboard.config)
    return HTMLResponse(training.training_page(fragment))


async def training_fragment(request: Request, dashboard: DashboardService) -> Response:
    params(request)
    return HTMLResponse(await run_in_threadpool(_training_html, dashboard.config))


def _training_html(config: DashboardConfig) -> str:
    """The trainer's metrics and the SFT statistics, each read afresh; a file
    that cannot be read shows why in its place."""
    metrics = sft = None
    metrics_problem = sft_problem = None
    if config.metrics is not None:
        try:
            metrics = read_metrics(config.metrics)
        except SourceError as exc:
            metrics_problem = exc.message
    if config.sft is not None:
        try:
            sft = read_sft_stats(config.sft)
        except SourceError as exc:
            sft_problem = exc.message
    configured = (config.metrics is not None, config.sft is not None)
    return training.training_fragment(metrics, metrics_problem, sft, sft_problem, configured)
