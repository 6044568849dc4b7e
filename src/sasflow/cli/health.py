"""`sasflow healthcheck`: are the store and the transport reachable? (exit status)

For liveness and readiness probes: exit 0 when both answer, 1 with one line
saying which does not. Nothing is written.
"""

from __future__ import annotations

import asyncio
import logging

import click

from sasflow.app import DEFAULT_STORE
from sasflow.cli.options import option, store_option, transport_option
from sasflow.cli.postgres_cause import postgres_cause
from sasflow.errors import StoreError
from sasflow.redact import redact
from sasflow.store import open_store
from sasflow.transport import open_transport


@click.command()
@store_option
@transport_option
@option("--timeout", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
        help="Seconds to wait for each answer.")
def healthcheck(store: str | None, transport: str | None, timeout: float) -> None:
    """Exit 0 if the state store and the transport answer, 1 if not."""

    async def check() -> None:
        url = store or DEFAULT_STORE
        opened_store = open_store(url, create=False, connect_within=timeout)
        try:
            async with asyncio.timeout(timeout):
                await opened_store.next_expiry()  # a read through the store's own path
        except (TimeoutError, StoreError) as error:
            await _name_postgres_cause(url, timeout, error)
            raise
        finally:
            await opened_store.close()
        opened_transport = open_transport(transport)
        try:
            async with asyncio.timeout(timeout):
                await opened_transport.ping()
        finally:
            await opened_transport.close()

    logging.disable(logging.CRITICAL)  # client libraries' own warnings: the answer is one line
    try:
        asyncio.run(check())
    except TimeoutError:
        raise click.ClickException(f"no answer within {timeout:g}s") from None
    click.echo("ok")


async def _name_postgres_cause(url: str, within: float, error: Exception) -> None:
    """Raise the cause a PostgreSQL store failed with (refused, authentication...),
    as the transports' checks do; the store's own error says only that it gave up."""
    if not url.startswith(("postgresql:", "postgres:")):
        return
    cause = await postgres_cause(url, within)
    if cause is not None:
        raise click.ClickException(
            f"cannot reach the PostgreSQL store at {redact(url)}: {cause}") from error
