"""The ASGI app of the operator surface: the JSON API under /api/v1, its
OpenAPI document at /api/v1/openapi.json, served by `sasflow serve`.

FastAPI (on Starlette) for the routes: it validates requests from type hints and
writes the OpenAPI document from the same declarations, which the route-walking
and fuzzing tests read; uvicorn serves it. Both are maintained, widely deployed,
and pure Python to install.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from sasflow.client import Client
from sasflow.errors import ConfigurationError
from sasflow.web import api, pages
from sasflow.web.auth import Users
from sasflow.web.errors import BodyLimit, handlers
from sasflow.web.session import Guard

__all__ = ["DEFAULT_BODY_LIMIT", "create_app"]

DEFAULT_BODY_LIMIT = 1024 * 1024  # bytes of a request body; more is refused with 413


def create_app(client: Client, users: Users, *, body_limit: int | None = None,
               trace_url: str | None = None) -> FastAPI:
    """The ASGI app serving `client` (an App: its workflows plan operator actions) to
    `users`: the JSON API, the dashboard at / and its static files. A request body
    over `body_limit` bytes (default: the client's payload limit plus room for the
    envelope) is refused with 413. `trace_url`, a template with ``{trace_id}``, links
    a task's page to its trace (tracing.py derives the id from the task's)."""
    app = FastAPI(title="sasflow", summary="Durable, self-healing multi-step tasks",
                  version="1", openapi_url="/api/v1/openapi.json", docs_url="/api/v1/docs",
                  redoc_url=None,
                  exception_handlers={**handlers(), pages.LOGIN_NEEDED: pages.login_redirect})
    app.state.client = client
    app.state.guard = Guard(users)
    app.state.trace_url = _trace_links(trace_url)
    app.include_router(api.router)
    app.include_router(api.scrape)
    app.include_router(pages.router)
    app.mount("/static", StaticFiles(directory=pages.STATIC), name="static")
    limit = body_limit or max(DEFAULT_BODY_LIMIT, client.max_payload_bytes + 64 * 1024)
    app.add_middleware(BodyLimit, limit=limit)
    return app


def _trace_links(template: str | None) -> Callable[[str], str | None]:
    if not template:
        return lambda task_id: None
    if "{trace_id}" not in template:
        raise ConfigurationError(f"the trace URL {template!r} has no {{trace_id}} in it")
    from sasflow.tracing import trace_id_of

    return lambda task_id: template.format(trace_id=trace_id_of(task_id))
