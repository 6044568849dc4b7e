"""`sasflow healthcheck`: are the store and the transport reachable, and is this
worker alive? (exit status; R2)

For liveness and readiness probes: exit 0 when both answer and, with
`--instance-id`, that worker instance's heartbeat is fresh on the store's clock;
1 with one line saying which is not so. Nothing is written.

A worker beats from the event loop its roles run in, and only while its store
answers, so a frozen, wedged or disconnected worker fails its own probe while
the store is fine. `--instance-id` defaults to `$SASFLOW_INSTANCE_ID`, the
variable `sasflow worker` takes its id from: in a container that sets it, the
probe checks that container's worker.
"""

from __future__ import annotations

import asyncio
import logging

import click

from sasflow.backends import DEFAULT_STORE
from sasflow.cli.options import (
    instance_name,
    logging_disabled,
    option,
    store_option,
    transport_option,
)
from sasflow.cli.postgres_cause import postgres_cause
from sasflow.errors import StoreError
from sasflow.redact import redact
from sasflow.store import Store, open_store
from sasflow.transport import open_transport


@click.command()
@store_option
@transport_option
@option("--instance-id", metavar="ID", envvar="SASFLOW_INSTANCE_ID",
        help="Also fail unless this worker instance's heartbeat is fresh (within its"
             " lease); {host} stands for the host's name.")
@option("--timeout", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
        help="Seconds to wait for each answer.")
def healthcheck(store: str | None, transport: str | None, instance_id: str | None,
                timeout: float) -> None:
    """Exit 0 if the state store and the transport answer (and the instance beats), 1 if not."""

    async def check() -> str | None:
        url = store or DEFAULT_STORE
        opened_store = open_store(url, create=False, connect_within=timeout)
        try:
            async with asyncio.timeout(timeout):
                await opened_store.next_expiry()  # a read through the store's own path
                problem = (await _heartbeat_problem(opened_store, instance_name(instance_id))
                           if instance_id else None)
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
        return problem

    try:
        # client libraries' own warnings: the answer is one line
        with logging_disabled(logging.CRITICAL):
            problem = asyncio.run(check())
    except TimeoutError:
        raise click.ClickException(f"no answer within {timeout:g}s") from None
    if problem is not None:
        raise click.ClickException(problem)
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


async def _heartbeat_problem(store: Store, instance_id: str) -> str | None:
    """Why the instance does not count as alive, or None if its heartbeat is fresh."""
    found = await store.instances(instance_id=instance_id)
    if not found:
        return f"worker instance {instance_id!r} has no heartbeat in this store"
    [instance] = found
    now = store.now()
    if instance.stopped_at is not None:
        return (f"worker instance {instance_id!r} stopped"
                f" {now - instance.stopped_at:.1f}s ago")
    silent = now - instance.beat_at
    if silent > instance.lease:
        return (f"worker instance {instance_id!r}: no heartbeat for {silent:.1f}s"
                f" (its lease is {instance.lease:g}s)")
    return None
