"""Operator commands: ``sasflow tasks ...`` and ``sasflow alerts list`` (U3, E8).

Reading needs only the store, so ``list``, ``show`` and ``alerts list`` work
without the application. Acting on a task (retry, compensate, cancel) needs the
workflow's definition to plan the change, so those need ``--app``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import click

from sasflow.app import DEFAULT_STORE, App
from sasflow.cli import output
from sasflow.cli.app_ref import AppRef, load_app
from sasflow.cli.options import CONNECT_WITHIN, Connection, connection_options, option
from sasflow.errors import UnknownTaskError
from sasflow.model import Task, TaskState
from sasflow.store import Store, open_store

__all__ = ["alerts", "tasks"]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def _json_option(f: F) -> F:
    return option("--json", "as_json", is_flag=True, envvar="SASFLOW_JSON",
                  help="Print JSON instead of a table.")(f)


def _connection(ctx: click.Context, app_ref: AppRef | None, store: str | None, *,
                need_app: bool = False) -> Connection:
    """The command's --app/--store, else its group's; --app when the command needs it."""
    found = ctx.find_object(Connection) or Connection()
    conn = found.merged(app_ref, store)
    if need_app and conn.app_ref is None:
        raise click.UsageError(
            f"'{ctx.command_path}' needs the application to plan the change:"
            " pass --app MODULE:ATTRIBUTE or set SASFLOW_APP", ctx=ctx)
    return conn


def _run(conn: Connection, work: Callable[[App | None, Store], Coroutine[Any, Any, T]]) -> T:
    """Run `work` against the app's store (with --app) or the store alone, then close it."""
    if conn.app_ref is None:
        store = open_store(conn.store or DEFAULT_STORE, create=False,
                           connect_within=CONNECT_WITHIN)

        async def alone() -> T:
            try:
                return await work(None, store)
            finally:
                await store.close()

        return asyncio.run(alone())
    app = load_app(conn.app_ref)
    app.configure(store=conn.store, connect_within=CONNECT_WITHIN)
    try:
        return asyncio.run(work(app, app.store))
    finally:
        app.close()


async def _get(store: Store, task_id: str) -> Task:
    task = await store.get(task_id)
    if task is None:
        raise UnknownTaskError(f"unknown task {task_id!r}", task_id=task_id)
    return task


# ---------------------------------------------------------------- tasks
@click.group()
@connection_options
@click.pass_context
def tasks(ctx: click.Context, app_ref: AppRef | None, store: str | None) -> None:
    """List and inspect tasks; retry, compensate or cancel one."""
    ctx.obj = Connection(app_ref=app_ref, store=store)


@tasks.command("list")
@option("--state", type=click.Choice([s.value for s in TaskState]),
        help="Only tasks in this state.")
@option("--workflow", metavar="NAME", help="Only tasks of this workflow.")
@option("--limit", type=click.IntRange(min=1), default=100, show_default=True,
        help="At most this many tasks.")
@_json_option
@connection_options
@click.pass_context
def list_tasks(ctx: click.Context, state: str | None, workflow: str | None, limit: int,
               as_json: bool, app_ref: AppRef | None, store: str | None) -> None:
    """List tasks, optionally by state and workflow."""
    wanted = TaskState(state) if state is not None else None

    async def work(app: App | None, db: Store) -> list[Task]:
        return await db.list_tasks(state=wanted, workflow=workflow, limit=limit)

    found = _run(_connection(ctx, app_ref, store), work)
    if as_json:
        click.echo(output.dumps([t.to_json(steps=False) for t in found]))
    else:
        click.echo(output.tasks_table(found))


@tasks.command("show")
@click.argument("task_id")
@option("--history", is_flag=True, help="Also show every recorded state change.")
@_json_option
@connection_options
@click.pass_context
def show_task(ctx: click.Context, task_id: str, history: bool, as_json: bool,
              app_ref: AppRef | None, store: str | None) -> None:
    """Show a task, its steps and (--history) its state changes."""

    async def work(app: App | None, db: Store) -> tuple[Task, list[Any]]:
        task = await _get(db, task_id)
        return task, (await db.history(task_id) if history else [])

    task, entries = _run(_connection(ctx, app_ref, store), work)
    if as_json:
        shown = task.to_json()
        if history:
            shown["history"] = [output.history_json(e) for e in entries]
        click.echo(output.dumps(shown))
        return
    click.echo(output.task_detail(task))
    if history:
        click.echo("\n" + output.history_table(entries))


def _act(ctx: click.Context, app_ref: AppRef | None, store: str | None, as_json: bool,
         action: Callable[[App, str], Awaitable[Task]], task_id: str) -> None:
    async def work(app: App | None, db: Store) -> Task:
        assert app is not None  # _connection(need_app=True) made sure
        return await action(app, task_id)

    task = _run(_connection(ctx, app_ref, store, need_app=True), work)
    if as_json:
        click.echo(output.dumps(task.to_json()))
    else:
        click.echo(f"task {task.task_id}: {task.state.value}")


@tasks.command("retry")
@click.argument("task_id")
@option("--step", metavar="NAME", help="The failed step to resubmit (default: the failed one).")
@_json_option
@connection_options
@click.pass_context
def retry_task(ctx: click.Context, task_id: str, step: str | None, as_json: bool,
               app_ref: AppRef | None, store: str | None) -> None:
    """Resubmit a task's failed step, once its cause is fixed."""
    _act(ctx, app_ref, store, as_json, lambda app, tid: app.aretry(tid, step), task_id)


@tasks.command("compensate")
@click.argument("task_id")
@_json_option
@connection_options
@click.pass_context
def compensate_task(ctx: click.Context, task_id: str, as_json: bool,
                    app_ref: AppRef | None, store: str | None) -> None:
    """Undo a task: compensate its completed steps, last first."""
    _act(ctx, app_ref, store, as_json, lambda app, tid: app.acompensate(tid), task_id)


@tasks.command("cancel")
@click.argument("task_id")
@_json_option
@connection_options
@click.pass_context
def cancel_task(ctx: click.Context, task_id: str, as_json: bool,
                app_ref: AppRef | None, store: str | None) -> None:
    """Stop a task where it is, undoing nothing."""
    _act(ctx, app_ref, store, as_json, lambda app, tid: app.acancel(tid), task_id)


# ---------------------------------------------------------------- alerts
@click.group()
@connection_options
@click.pass_context
def alerts(ctx: click.Context, app_ref: AppRef | None, store: str | None) -> None:
    """Operator alerts: a task gone to error, or an incident (work no live worker takes)."""
    ctx.obj = Connection(app_ref=app_ref, store=store)


@alerts.command("list")
@option("--limit", type=click.IntRange(min=1), default=100, show_default=True,
        help="At most this many alerts.")
@option("--after", metavar="ID", type=click.IntRange(min=0), default=0, show_default=True,
        help="Only alerts with a greater id (to page, or to follow new ones).")
@_json_option
@connection_options
@click.pass_context
def list_alerts(ctx: click.Context, limit: int, after: int, as_json: bool,
                app_ref: AppRef | None, store: str | None) -> None:
    """List operator alerts, oldest first."""

    async def work(app: App | None, db: Store) -> list[Any]:
        return await db.alerts(limit=limit, after=after)

    found = _run(_connection(ctx, app_ref, store), work)
    if as_json:
        click.echo(output.dumps([output.alert_json(a) for a in found]))
    else:
        click.echo(output.alerts_table(found))
