"""`sasflow db upgrade`: bring a store's schema up to date with this release."""

from __future__ import annotations

import asyncio

import click

from sasflow.app import DEFAULT_STORE
from sasflow.cli.options import store_option
from sasflow.store import open_store


@click.group()
def db() -> None:
    """The state store's schema."""


@db.command("upgrade")
@store_option
def upgrade(store: str | None) -> None:
    """Apply the schema migrations the store has not seen yet (safe to repeat)."""
    url = store or DEFAULT_STORE

    async def apply() -> None:
        opened = open_store(url)  # opening applies what is missing, under a lock
        try:
            await opened.next_expiry()  # a first query: the schema is there
        finally:
            await opened.close()

    asyncio.run(apply())
    click.echo(f"schema up to date: {url.split('?')[0]}")
