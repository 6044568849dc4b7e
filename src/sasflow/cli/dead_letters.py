"""``sasflow dead-letters list|show ID|purge``: the messages no consumer could handle (R3).

Where they are read depends on the transport: a broker keeps its own (the
``sasflow.dead-letters`` queue on RabbitMQ, stream on Redis); the in-process
transport's are in the state store, since its queues died with their process.
So the command takes ``--transport`` and ``--store`` as the workers do. Reading
changes nothing: a listed dead letter stays until ``purge``.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from sasflow.app import DEFAULT_STORE, App
from sasflow.cli import output
from sasflow.cli.options import logging_disabled, option, store_option, transport_option
from sasflow.errors import InputError
from sasflow.model import isoformat
from sasflow.transport import DeadLetter
from sasflow.transport.dead_letter import preview

__all__ = ["dead_letters"]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class _Where:
    """The --store/--transport given to the group (a command's own take precedence)."""

    store: str | None = None
    transport: str | None = None

    def merged(self, store: str | None, transport: str | None) -> _Where:
        return _Where(store=store or self.store, transport=transport or self.transport)


def _options(f: F) -> F:
    return store_option(transport_option(f))


def _json_option(f: F) -> F:
    return option("--json", "as_json", is_flag=True, envvar="SASFLOW_JSON",
                  help="Print JSON instead of a table.")(f)


def _with_app(ctx: click.Context, store: str | None, transport: str | None,
              read: Callable[[App], T]) -> T:
    """`read` through an App on where the dead letters are kept, then close it."""
    where = (ctx.find_object(_Where) or _Where()).merged(store, transport)
    app = App(store=where.store or DEFAULT_STORE, transport=where.transport)
    app.configure(create=False)  # a wrong --store is an error, not a new empty store
    # a client library's own reconnect warnings: the answer, or the error, is one line
    with logging_disabled(logging.WARNING):
        try:
            return read(app)
        finally:
            app.close()


@click.group("dead-letters")
@_options
@click.pass_context
def dead_letters(ctx: click.Context, store: str | None, transport: str | None) -> None:
    """Messages no consumer could handle, kept with the reason (R3)."""
    ctx.obj = _Where(store=store, transport=transport)


@dead_letters.command("list")
@option("--limit", type=click.IntRange(min=1), default=100, show_default=True,
        help="At most this many dead letters.")
@_json_option
@_options
@click.pass_context
def list_dead_letters(ctx: click.Context, limit: int, as_json: bool, store: str | None,
                      transport: str | None) -> None:
    """List dead letters, oldest first, bodies cut short."""
    found = _with_app(ctx, store, transport, lambda app: app.dead_letters(limit=limit))
    if as_json:
        click.echo(output.dumps([_json(d, whole=False) for d in found]))
    elif not found:
        click.echo("no dead letters")
    else:
        click.echo(output.table(
            ["ID", "QUEUE", "DELIVERIES", "FIRST SEEN", "AT", "REASON", "BODY"],
            [[d.id, d.queue, str(d.deliveries), _when(d.first_seen), _when(d.at),
              _cut(d.reason), preview(d.body, 40)] for d in found]))


@dead_letters.command("show")
@click.argument("letter_id", metavar="ID")
@_json_option
@_options
@click.pass_context
def show_dead_letter(ctx: click.Context, letter_id: str, as_json: bool, store: str | None,
                     transport: str | None) -> None:
    """Show one dead letter with its whole body."""
    letter = _with_app(ctx, store, transport, lambda app: app.dead_letter(letter_id))
    if letter is None:
        raise InputError(f"no dead letter {letter_id!r} (see 'sasflow dead-letters list')")
    if as_json:
        click.echo(output.dumps(_json(letter, whole=True)))
        return
    for label, value in (("id", letter.id), ("queue", letter.queue),
                         ("deliveries", str(letter.deliveries)),
                         ("first seen", _when(letter.first_seen)), ("at", _when(letter.at)),
                         ("reason", letter.reason)):
        click.echo(f"{label + ':':<12}{value}")
    click.echo("body:")
    click.echo(letter.body.decode("utf-8", errors="backslashreplace"))


@dead_letters.command("purge")
@_json_option
@_options
@click.pass_context
def purge_dead_letters(ctx: click.Context, as_json: bool, store: str | None,
                       transport: str | None) -> None:
    """Forget every dead letter."""
    count = _with_app(ctx, store, transport, lambda app: app.purge_dead_letters())
    click.echo(output.dumps({"purged": count}) if as_json
               else f"purged {count} dead letter{'' if count == 1 else 's'}")


def _json(letter: DeadLetter, *, whole: bool) -> dict[str, Any]:
    """A dead letter as JSON; a body that is not UTF-8 also comes whole in base64."""
    text = letter.body.decode("utf-8", errors="replace")
    shown: dict[str, Any] = {
        "id": letter.id, "queue": letter.queue, "reason": letter.reason,
        "deliveries": letter.deliveries, "first_seen": isoformat(letter.first_seen),
        "at": isoformat(letter.at), "body_bytes": len(letter.body),
        "body": text if whole else preview(letter.body)}
    if whole:
        try:
            letter.body.decode("utf-8")
        except UnicodeDecodeError:
            shown["body_base64"] = base64.b64encode(letter.body).decode("ascii")
    return shown


def _when(ts: float) -> str:
    return isoformat(ts) or "-" if ts else "-"


def _cut(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."
