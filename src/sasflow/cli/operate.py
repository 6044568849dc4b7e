"""Operator commands: ``sasflow tasks ...`` and ``sasflow alerts list`` (U3, E8).

Each goes through the App's client methods, as an application's own code would.
Reading needs only the store, so ``list``, ``show`` and ``alerts list`` work
without the application (a bare App on the store). Acting on a task (retry,
compensate, cancel) needs the workflow's definition to plan the change, so
those need ``--app``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import click

from sasflow.app import DEFAULT_STORE, App
from sasflow.cli import output
from sasflow.cli.app_ref import AppRef, load_app
from sasflow.cli.options import CONNECT_WITHIN, Connection, connection_options, option
from sasflow.model import Task, TaskState

__all__ = ["alerts", "opened", "tasks"]

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


@contextlib.contextmanager
def opened(conn: Connection) -> Iterator[App]:
    """The application (with --app), else a bare App on the store; closed afterwards.

    Without the application nothing creates the store: a wrong --store is an error
    rather than a new, empty store."""
    if conn.app_ref is None:
        app = App(store=conn.store or DEFAULT_STORE)
        app.configure(connect_within=CONNECT_WITHIN, create=False)
    else:
        app = load_app(conn.app_ref)
        app.configure(store=conn.store, connect_within=CONNECT_WITHIN)
    try:
        yield app
    finally:
        app.close()


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
    with opened(_connection(ctx, app_ref, store)) as app:
        found = app.list(state=state, workflow=workflow, limit=limit)
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
    with opened(_connection(ctx, app_ref, store)) as app:
        task = app.get(task_id)
        entries = app.history(task_id) if history else []
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
         action: Callable[[App, str], Task], task_id: str) -> None:
    with opened(_connection(ctx, app_ref, store, need_app=True)) as app:
        task = action(app, task_id)
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
    _act(ctx, app_ref, store, as_json, lambda app, tid: app.retry(tid, step), task_id)


@tasks.command("compensate")
@click.argument("task_id")
@_json_option
@connection_options
@click.pass_context
def compensate_task(ctx: click.Context, task_id: str, as_json: bool,
                    app_ref: AppRef | None, store: str | None) -> None:
    """Undo a task: compensate its completed steps, last first."""
    _act(ctx, app_ref, store, as_json, lambda app, tid: app.compensate(tid), task_id)


@tasks.command("cancel")
@click.argument("task_id")
@_json_option
@connection_options
@click.pass_context
def cancel_task(ctx: click.Context, task_id: str, as_json: bool,
                app_ref: AppRef | None, store: str | None) -> None:
    """Stop a task where it is, undoing nothing."""
    _act(ctx, app_ref, store, as_json, lambda app, tid: app.cancel(tid), task_id)


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
    with opened(_connection(ctx, app_ref, store)) as app:
        found = app.alerts(limit=limit, after=after)
    if as_json:
        click.echo(output.dumps([output.alert_json(a) for a in found]))
    else:
        click.echo(output.alerts_table(found))
