"""The HTTP API's routes, under /api/v1 (SPEC U4, E8).

Each goes through the application's client (client.py, operations.py), as the
CLI does: the API adds who may call it (auth.py) and JSON shapes (schemas.py),
nothing of the domain. Each route names the role it needs in its OpenAPI entry
(`x-sasflow-role`; `none` for the health check alone). /api/v1/metrics, also
answered at /metrics (the `scrape` router), is the store's state for
Prometheus (metrics.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Depends, Path, Query, Request, Security
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException

from sasflow.cli.output import alert_json, history_json
from sasflow.client import Client
from sasflow.errors import SasflowError
from sasflow.metrics import CONTENT_TYPE, store_exposition
from sasflow.model import Task, TaskState, isoformat
from sasflow.store.listing import MAX_PAGE, encode_cursor
from sasflow.store.records import Instance
from sasflow.transport.dead_letter import DeadLetter
from sasflow.web import schemas as s
from sasflow.web.auth import OPERATOR, VIEWER, Principal
from sasflow.web.session import authenticated

__all__ = ["COUNTS_TTL_S", "ROLE_KEY", "router", "scrape"]

T = TypeVar("T")

ROLE_KEY = "x-sasflow-role"
# the counts by state (they scan an index) and the instances are kept this long:
# dashboards and Prometheus poll them
COUNTS_TTL_S = 2.0
_bearer = HTTPBearer(auto_error=False, description="A token from `sasflow tokens new`.")

log = logging.getLogger("sasflow.web")
router = APIRouter(prefix="/api/v1")
scrape = APIRouter()  # /metrics, where Prometheus looks by default


def _caller(role: str) -> Callable[..., Awaitable[Principal]]:
    async def caller(request: Request, credentials: Annotated[
            HTTPAuthorizationCredentials | None, Security(_bearer)]) -> Principal:
        principal = authenticated(request, credentials.credentials if credentials else None)
        if principal is None:
            raise HTTPException(401, "authentication required: a bearer token or a session",
                                headers={"WWW-Authenticate": "Bearer"})
        if not principal.may(role):
            raise HTTPException(403, f"this needs the {role} role; {principal.name} is a"
                                     f" {principal.role}")
        return principal

    return caller


Viewer = Annotated[Principal, Depends(_caller(VIEWER))]
Operator = Annotated[Principal, Depends(_caller(OPERATOR))]


def _role(role: str) -> dict[str, Any]:
    return {"openapi_extra": {ROLE_KEY: role}}


def _client(request: Request) -> Client:
    client: Client = request.app.state.client
    return client


def _task(task: Task) -> dict[str, Any]:
    return task.to_json(steps=False)


async def _kept(request: Request, name: str, read: Callable[[], Awaitable[T]]) -> T:
    """`read()`'s answer, kept on the app under `name` for COUNTS_TTL_S."""
    state = request.app.state
    kept: dict[str, tuple[float, Any]] | None = getattr(state, "kept", None)
    if kept is None:
        kept = state.kept = {}
    found = kept.get(name)
    if found is None or time.monotonic() - found[0] > COUNTS_TTL_S:
        found = kept[name] = (time.monotonic(), await read())
    value: T = found[1]
    return value


# ---------------------------------------------------------------- health
@router.get("/health", response_model=s.HealthOut, **_role("none"),
            responses={503: {"description": "The store cannot be reached."}})
async def health(request: Request) -> Any:
    """Whether the server can read its store. Anonymous: for load balancers."""
    try:
        await _client(request).aalerts(limit=1)  # one indexed read
    except SasflowError as error:
        return JSONResponse({"status": "unavailable", "store": str(error)}, status_code=503)
    return {"status": "ok", "store": "ok"}


# ---------------------------------------------------------------- tasks
@router.get("/tasks", response_model=s.TaskPageOut, **_role(VIEWER))
async def list_tasks(
        request: Request, caller: Viewer,
        state: TaskState | None = None,
        workflow: Annotated[str | None, Query(max_length=200)] = None,
        created_from: Annotated[datetime | None, Query(
            description="Created at or after (ISO-8601; UTC if no offset).")] = None,
        created_to: Annotated[datetime | None, Query(description="Created before.")] = None,
        task_id: Annotated[str | None, Query(
            max_length=200, description="Only this task, if it matches the filters.")] = None,
        order: Literal["newest", "oldest"] = "newest",
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
        cursor: Annotated[str | None, Query(max_length=1000)] = None) -> Any:
    """A page of tasks, newest first unless told, with the cursor of the next page."""
    client = _client(request)
    if task_id is not None:  # a search by id: that task, as a page of one or none
        try:
            found = [await client.aget(task_id)]
        except SasflowError:
            found = []
        found = [t for t in found if (state is None or t.state is state)
                 and (workflow is None or t.workflow == workflow)]
        return {"tasks": [_task(t) for t in found], "next_cursor": None}
    tasks = await client.alist(
        state=None if state is None else state.value, workflow=workflow, limit=limit,
        created_from=_seconds(created_from), created_to=_seconds(created_to),
        cursor=cursor, newest_first=order == "newest")
    return {"tasks": [_task(t) for t in tasks],
            "next_cursor": encode_cursor(tasks[-1]) if len(tasks) == limit else None}


@router.get("/tasks/counts", response_model=s.CountsOut, **_role(VIEWER))
async def count_tasks(request: Request, caller: Viewer) -> Any:
    """How many tasks are in each state (kept for a couple of seconds)."""
    counts = await _counts(request)
    return {"counts": counts, "total": sum(counts.values())}


async def _counts(request: Request) -> dict[str, int]:
    counts = await _kept(request, "counts", _client(request).acount)
    return {state.value: n for state, n in counts.items()}


@router.post("/tasks", response_model=s.SubmittedOut, status_code=201, **_role(OPERATOR))
async def submit_task(request: Request, caller: Operator, body: s.SubmitIn) -> Any:
    """Submit a task; idempotent on `task_id`."""
    task_id = await _client(request).asubmit(body.workflow, body.input, task_id=body.task_id,
                                             reply_to=body.reply_to)
    return {"task_id": task_id}


@router.get("/tasks/{task_id:path}", response_model=s.TaskDetailOut, **_role(VIEWER))
async def show_task(request: Request, caller: Viewer, task_id: str) -> Any:
    """A task with its steps (attempts, deadlines, errors, compensations) and history."""
    return await _detail(_client(request), task_id)


async def _detail(client: Client, task_id: str) -> dict[str, Any]:
    task = await client.aget(task_id)
    history = await client.ahistory(task_id)
    return {**task.to_json(), "input": task.input,
            "history": [history_json(entry) for entry in history]}


@router.post("/tasks/{task_id:path}/retry", response_model=s.TaskDetailOut,
             **_role(OPERATOR))
async def retry_task(request: Request, caller: Operator, task_id: str, body: s.RetryIn) -> Any:
    """Resubmit the task's failed step, once its cause is fixed (E8)."""
    client = _client(request)
    await client.aretry(task_id, body.step, by=caller.name, reason=body.reason)
    return await _detail(client, task_id)


@router.post("/tasks/{task_id:path}/compensate", response_model=s.TaskDetailOut,
             **_role(OPERATOR))
async def compensate_task(request: Request, caller: Operator, task_id: str,
                          body: s.Reason) -> Any:
    """Undo the task: compensate its completed steps, last first."""
    client = _client(request)
    await client.acompensate(task_id, by=caller.name, reason=body.reason)
    return await _detail(client, task_id)


@router.post("/tasks/{task_id:path}/cancel", response_model=s.TaskDetailOut,
             **_role(OPERATOR))
async def cancel_task(request: Request, caller: Operator, task_id: str,
                      body: s.Reason) -> Any:
    """Stop the task where it is, undoing nothing."""
    client = _client(request)
    await client.acancel(task_id, by=caller.name, reason=body.reason)
    return await _detail(client, task_id)


# ---------------------------------------------------------------- alerts
@router.get("/alerts", response_model=s.AlertsOut, **_role(VIEWER))
async def list_alerts(request: Request, caller: Viewer,
                      after: Annotated[int, Query(ge=0, le=2**62)] = 0,
                      limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100) -> Any:
    """Alerts, oldest first; `after` an id, to page or to follow new ones."""
    found = await _client(request).aalerts(limit=limit, after=after)
    return {"alerts": [_alert(a) for a in found]}


@router.post("/alerts/{alert_id}/acknowledge", response_model=s.AlertOut, **_role(OPERATOR))
async def acknowledge_alert(request: Request, caller: Operator,
                            alert_id: Annotated[int, Path(ge=0, le=2**62)],
                            body: s.Reason) -> Any:
    """Record that the alert was seen and needs nothing more (the first stands)."""
    alert = await _client(request).aacknowledge(alert_id, by=caller.name, reason=body.reason)
    return _alert(alert)


def _alert(alert: Any) -> dict[str, Any]:
    return {**alert_json(alert), "incident": alert.incident, "count": alert.count,
            "resolved_at": isoformat(alert.resolved_at),
            "acknowledged_at": isoformat(alert.acknowledged_at),
            "acknowledged_by": alert.acknowledged_by,
            "acknowledged_why": alert.acknowledged_why}


# ---------------------------------------------------------------- instances
@router.get("/instances", response_model=s.InstancesOut, **_role(VIEWER))
async def list_instances(request: Request, caller: Viewer) -> Any:
    """Worker instances, with their roles and heartbeats."""
    client = _client(request)
    found = await client.ainstances()
    now = client.now()
    return {"instances": [_instance(i, now) for i in found]}


# ---------------------------------------------------------------- metrics
@router.get("/metrics", **_role(VIEWER), response_class=PlainTextResponse, responses={
    200: {"content": {CONTENT_TYPE: {}},
          "description": "Prometheus' text format: sasflow_tasks{state},"
                         " sasflow_worker_heartbeat_age_seconds{instance}, ..."}})
@scrape.get("/metrics", **_role(VIEWER), response_class=PlainTextResponse,
            summary="Metrics (as /api/v1/metrics)")
async def metrics(request: Request, caller: Viewer) -> Response:
    """The store's state for Prometheus: tasks by state, and the heartbeat of each
    running worker instance (read at most every couple of seconds). The workers'
    own counts are on their --metrics-port."""
    client = _client(request)
    counts = await _counts(request)
    instances = await _kept(request, "instances", client.ainstances)
    return Response(store_exposition(counts, instances, client.now()),
                    media_type=CONTENT_TYPE)


def _instance(instance: Instance, now: float) -> dict[str, Any]:
    return {"instance_id": instance.instance_id, "host": instance.host, "pid": instance.pid,
            "roles": instance.roles, "agents": instance.agents,
            "workflows": instance.workflows, "started_at": isoformat(instance.started_at),
            "beat_at": isoformat(instance.beat_at),
            "heartbeat_age_s": round(max(0.0, now - instance.beat_at), 3),
            "live": instance.stopped_at is None and now <= instance.beat_at + instance.lease,
            "stopped_at": isoformat(instance.stopped_at)}


# ---------------------------------------------------------------- dead letters
@router.get("/dead-letters", response_model=s.DeadLettersOut, **_role(VIEWER))
async def list_dead_letters(request: Request, caller: Viewer,
                            limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100) -> Any:
    """Messages no consumer could handle (R3), oldest first."""
    found = await _client(request).adead_letters(limit=limit)
    return {"dead_letters": [_letter(letter) for letter in found]}


@router.get("/dead-letters/{letter_id}", response_model=s.DeadLetterOut, **_role(VIEWER))
async def show_dead_letter(request: Request, caller: Viewer, letter_id: str) -> Any:
    letter = await _client(request).adead_letter(letter_id)
    if letter is None:
        raise HTTPException(404, f"no dead letter {letter_id!r}")
    return _letter(letter)


@router.post("/dead-letters/purge", response_model=s.PurgedOut, **_role(OPERATOR))
async def purge_dead_letters(request: Request, caller: Operator, body: s.Reason) -> Any:
    """Forget every dead letter; how many there were."""
    purged = await _client(request).apurge_dead_letters()
    log.warning("%s purged %d dead letter(s): %s", caller.name, purged, body.reason)
    return {"purged": purged}


def _letter(letter: DeadLetter) -> dict[str, Any]:
    return {"id": letter.id, "queue": letter.queue, "reason": letter.reason,
            "deliveries": letter.deliveries, "first_seen": isoformat(letter.first_seen),
            "at": isoformat(letter.at), "body": letter.body.decode("utf-8", "replace")}


def _seconds(when: datetime | None) -> float | None:
    if when is None:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
