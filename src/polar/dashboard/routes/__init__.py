"""The dashboard's route handlers, grouped by what they serve: the open routes
(:mod:`.login`), the pages and their fragments (:mod:`.pages`), the JSON API
(:mod:`.api`) and the event stream (:mod:`.events`). Each is a module-level
function that reaches the :class:`~polar.dashboard.service.DashboardService`
through ``request.app.state``; :mod:`.guard` checks the token and maps errors.
"""

from __future__ import annotations

from importlib import resources

from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from polar.dashboard.routes import api, events, login, pages
from polar.dashboard.routes.guard import api_route, html_route


def routes() -> list[BaseRoute]:
    static = StaticFiles(directory=str(resources.files("polar.dashboard") / "static"))
    return [
        Route("/health", login.health),
        Route("/login", login.login_form, methods=["GET"]),
        Route("/login", login.login, methods=["POST"]),
        Route("/logout", login.logout, methods=["POST"]),
        Mount("/static", static, name="static"),
        Route("/", html_route(pages.tasks_page)),
        Route("/tasks/{task_id}", html_route(pages.task_page)),
        Route("/sessions", html_route(pages.sessions_page)),
        Route("/sessions/{session_id}", html_route(pages.session_page)),
        Route("/sessions/{session_id}/traces/{index}", html_route(pages.token_page)),
        Route("/training", html_route(pages.training_page)),
        Route("/fragments/tasks", api_route(pages.tasks_fragment)),
        Route("/fragments/tasks/{task_id}", api_route(pages.task_fragment)),
        Route("/fragments/training", api_route(pages.training_fragment)),
        Route("/api/tasks", api_route(api.tasks_api)),
        Route("/api/tasks/{task_id}/cancel", api_route(api.cancel_api), methods=["POST"]),
        Route("/api/events", api_route(events.events_api)),
        Route("/api/sessions/{session_id}/traces/{index}/tokens", api_route(api.tokens_api)),
    ]
