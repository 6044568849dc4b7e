"""``sasflow tasks migrate``: move tasks of an old workflow version onto the new one.

A rolling upgrade that changes a workflow's steps leaves tasks of the old version
to the workers that still declare it (R4, M4). When those are gone, this command
re-plans the pending and error tasks of other versions onto the application's
declaration, each only where that is provably safe (plan.Plan.migrate): it says
what it did, task by task, and fails (exit 1) if any task could not be moved.
"""

from __future__ import annotations

import click

from sasflow.cli import output
from sasflow.cli.app_ref import AppRef
from sasflow.cli.operate import _connection, _json_option, opened
from sasflow.cli.options import connection_options, option
from sasflow.errors import InvalidTransitionError

__all__ = ["migrate_tasks"]


@click.command("migrate")
@option("--workflow", metavar="NAME", required=True,
        help="The workflow whose tasks of other versions are moved onto the app's.")
@option("--from-version", metavar="VERSION",
        help="Only the tasks of this version (default: every other version).")
@option("--dry-run", is_flag=True, help="Say what would be done; write nothing.")
@_json_option
@connection_options
@click.pass_context
def migrate_tasks(ctx: click.Context, workflow: str, from_version: str | None, dry_run: bool,
                  as_json: bool, app_ref: AppRef | None, store: str | None) -> None:
    """Move pending and error tasks of other versions of a workflow onto the app's.

    A task moves only if every step it has run keeps its place, name and agent in
    the app's declaration; its later steps become the declaration's. Tasks being
    run are left to the workers of their own version.
    """
    with opened(_connection(ctx, app_ref, store, need_app=True)) as app:
        done = app.migrate(workflow, from_version=from_version, dry_run=dry_run)
    if as_json:
        click.echo(output.dumps([{"task_id": m.task_id, "from_version": m.from_version,
                                  "to_version": m.to_version, "migrated": m.migrated,
                                  "dry_run": dry_run, "refused": m.refused} for m in done]))
    else:
        verb = "would migrate" if dry_run else "migrated"
        for m in done:
            click.echo(f"task {m.task_id}: {verb} from {m.from_version} to {m.to_version}"
                       if m.migrated else f"task {m.task_id}: refused: {m.refused}")
        moved = sum(m.migrated for m in done)
        click.echo(f"{moved} task(s) {verb}, {len(done) - moved} refused")
    refused = len(done) - sum(m.migrated for m in done)
    if refused:
        raise InvalidTransitionError(f"{refused} task(s) of {workflow!r} could not be"
                                     " migrated (see above)")
