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
        opened_store = open_store(store or DEFAULT_STORE, create=False)
        try:
            async with asyncio.timeout(timeout):
                await opened_store.next_expiry()  # a read through the store's own path
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
