"""`sasflow db upgrade`: bring a store's schema up to date with this release."""

from __future__ import annotations

import asyncio

import click

from sasflow.backends import DEFAULT_STORE
from sasflow.cli.options import CONNECT_WITHIN, store_option
from sasflow.redact import redact
from sasflow.store import open_store


@click.group()
def db() -> None:
    """The state store's schema."""


@db.command("upgrade")
@store_option
def upgrade(store: str | None) -> None:
    """Apply the schema migrations the store has not seen yet (safe to repeat)."""
    url = store or DEFAULT_STORE

    async def apply() -> list[str]:
        # opening applies what is missing, under a lock
        opened = open_store(url, connect_within=CONNECT_WITHIN)
        try:
            await opened.next_expiry()  # a first query: the schema is there
            applied: list[str] = getattr(opened, "migrations_applied", [])
            return applied
        finally:
            await opened.close()

    applied = asyncio.run(apply())
    shown = redact(url)
    if applied:
        click.echo(f"applied {len(applied)} migration{'s' * (len(applied) > 1)} to {shown}:"
                   f" {', '.join(applied)}")
    else:
        click.echo(f"schema already up to date: {shown}")
