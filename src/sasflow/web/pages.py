"""The dashboard (SPEC U4): server-rendered pages over the same client as the API.

Plain HTML from Jinja2 templates, which escape every value they are given (a task
id or an input holding ``<script>`` shows as text). One small script of ours
(static/dashboard.js) re-reads the page's main part every few seconds, so a task
is seen moving without a reload, and sends the operator's actions to the JSON API
with the session's CSRF token. Nothing comes from another server: no CDN, no
build step.

A page needs a session: without one it sends the browser to /login, which makes
one from a user's name and token (session.py).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlencode

import jinja2
from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from starlette.exceptions import HTTPException

from sasflow.client import Client
from sasflow.errors import SasflowError
from sasflow.model import TaskState, isoformat
from sasflow.store.listing import encode_cursor
from sasflow.store.records import HistoryEntry
from sasflow.web.session import COOKIE, Guard, Session

__all__ = ["STATIC", "router"]

_HERE = Path(str(resources.files("sasflow.web")))
STATIC = _HERE / "static"
PAGE_SIZE = 50
# every value is escaped, whatever the template's name (the default would go by it)
_templates = Jinja2Templates(env=jinja2.Environment(
    loader=jinja2.FileSystemLoader(_HERE / "templates"), autoescape=True))
_templates.env.filters["when"] = lambda ts: (isoformat(ts) or "-")[:19].replace("T", " ")
# JSON for reading, escaped as any text is (tojson's \u003c is for inside a script)
_templates.env.filters["pretty"] = lambda value: json.dumps(value, indent=2, ensure_ascii=False)

router = APIRouter(include_in_schema=False)


class _LoginNeeded(Exception):
    def __init__(self, path: str) -> None:
        self.path = path


def _session(request: Request) -> Session:
    guard: Guard = request.app.state.guard
    session = guard.session(request.cookies.get(COOKIE))
    if session is None:
        raise _LoginNeeded(request.url.path)
    return session


def _client(request: Request) -> Client:
    client: Client = request.app.state.client
    return client


def _page(request: Request, name: str, **context: Any) -> HTMLResponse:
    """The page, or (for the script's refresh) only its main part."""
    session = _session(request)
    fragment = request.query_params.get("fragment") == "1"
    return _templates.TemplateResponse(request, name, {
        "session": session, "fragment": fragment, "states": [s.value for s in TaskState],
        **context})


# ---------------------------------------------------------------- login
@router.get("/login")
async def login_form(request: Request, next: str = "/") -> HTMLResponse:
    return _templates.TemplateResponse(request, "login.html", {"next": _local(next),
                                                               "error": None})


@router.post("/login")
async def login(request: Request, name: Annotated[str, Form(max_length=64)],
                token: Annotated[str, Form(max_length=200)],
                next: Annotated[str, Form(max_length=500)] = "/") -> Response:
    guard: Guard = request.app.state.guard
    address = request.client.host if request.client else "unknown"
    made = guard.login(address, name, token)
    if made is None:
        return _templates.TemplateResponse(
            request, "login.html", {"next": _local(next),
                                    "error": "Unknown name or wrong token."},
            status_code=401)
    session_id, _ = made
    response = RedirectResponse(_local(next), status_code=303)
    response.set_cookie(COOKIE, session_id, httponly=True, samesite="strict",
                        secure=request.url.scheme == "https", path="/")
    return response


@router.post("/logout")
async def logout(request: Request, csrf_token: Annotated[str, Form(max_length=200)]
                 ) -> Response:
    guard: Guard = request.app.state.guard
    session = guard.session(request.cookies.get(COOKIE))
    if session is not None and session.csrf == csrf_token:
        guard.logout(request.cookies.get(COOKIE))
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE, path="/")
    return response


def _local(path: str) -> str:
    """Only a path of this server: never a redirect to another site."""
    return path if path.startswith("/") and not path.startswith("//") else "/"


# ---------------------------------------------------------------- pages
@router.get("/")
async def overview(request: Request) -> HTMLResponse:
    _session(request)
    client = _client(request)
    counts = {state.value: n for state, n in (await client.acount()).items()}
    alerts = await client.aalerts(limit=1000)
    bars = [(minute.get(TaskState.PROCESSED, 0),
             sum(minute.values()) - minute.get(TaskState.PROCESSED, 0))
            for minute in await client.athroughput()]
    peak = max(ok + bad for ok, bad in bars)
    return _page(request, "overview.html", counts=counts, total=sum(counts.values()),
                 open_alerts=sum(a.acknowledged_at is None for a in alerts), bars=bars,
                 peak=peak, top=max(peak, 1), ended=sum(ok + bad for ok, bad in bars))


@router.get("/tasks")
async def tasks(request: Request, state: str | None = None,
                workflow: Annotated[str | None, Query(max_length=200)] = None,
                search: Annotated[str | None, Query(max_length=200)] = None,
                cursor: Annotated[str | None, Query(max_length=1000)] = None) -> HTMLResponse:
    _session(request)
    client = _client(request)
    state = state or None
    workflow = workflow or None
    error = None
    found: list[Any] = []
    next_url = None
    try:
        if search:
            try:
                found = [await client.aget(search.strip())]
            except SasflowError:
                found = []
        else:
            found = await client.alist(state=state, workflow=workflow, limit=PAGE_SIZE,
                                       cursor=cursor, newest_first=True)
            if len(found) == PAGE_SIZE:
                query = {k: v for k, v in (("state", state), ("workflow", workflow)) if v}
                next_url = "/tasks?" + urlencode({**query, "cursor": encode_cursor(found[-1])})
    except SasflowError as refused:
        error = str(refused)
    return _page(request, "tasks.html", tasks=found, state=state, workflow=workflow,
                 search=search, next_url=next_url, error=error)


@router.get("/tasks/{task_id:path}")
async def task(request: Request, task_id: str) -> HTMLResponse:
    _session(request)
    client = _client(request)
    try:
        found = await client.aget(task_id)
    except SasflowError:
        raise HTTPException(404, f"unknown task {task_id!r}") from None
    history = await client.ahistory(task_id)
    return _page(request, "task.html", task=found, history=history,
                 took=_durations(history),
                 task_url=quote(task_id, safe=""),
                 trace_url=request.app.state.trace_url(task_id))


@router.get("/alerts")
async def alerts(request: Request) -> HTMLResponse:
    _session(request)
    found = await _client(request).aalerts(limit=1000)
    return _page(request, "alerts.html", alerts=list(reversed(found)))


@router.get("/instances")
async def instances(request: Request) -> HTMLResponse:
    _session(request)
    client = _client(request)
    found = await client.ainstances()
    return _page(request, "instances.html", instances=found, now=client.now())


@router.get("/dead-letters")
async def dead_letters(request: Request) -> HTMLResponse:
    _session(request)
    found = await _client(request).adead_letters(limit=200)
    return _page(request, "dead_letters.html", letters=found)


def _durations(history: list[HistoryEntry]) -> dict[tuple[str, str], float]:
    """How long each unit's last attempt ran, by (step, phase): from its move to
    running to its move out of it, as the history records them."""
    started: dict[tuple[str, str], float] = {}
    took: dict[tuple[str, str], float] = {}
    for entry in history:
        if entry.step is None:
            continue
        unit = (entry.step, entry.phase or "do")
        if entry.to_state in ("running", "compensating"):
            started[unit] = entry.at
        elif unit in started and entry.from_state in ("running", "compensating"):
            took[unit] = entry.at - started.pop(unit)
    return took


async def login_redirect(request: Request, error: Exception) -> Response:
    """Where a page sends a visitor without a session (the app's exception handler)."""
    assert isinstance(error, _LoginNeeded)
    return RedirectResponse("/login?" + urlencode({"next": error.path}), status_code=303)


LOGIN_NEEDED = _LoginNeeded
