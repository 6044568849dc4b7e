"""Fixtures of the contract suites: every store and every transport, one parameter each.

A backend joins a suite by adding one entry to STORES or TRANSPORTS
(support/backends.py). Tests only ever see
the `Store` / `Transport` protocols, through factories, so a test can open a
second instance on the same backing state (two scheduler hosts, say).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from urllib.parse import urlencode

import pytest

from sasflow.store import Store, open_store
from sasflow.transport import Transport, open_transport
from sasflow.transport.base import DEFAULT_MAX_MESSAGE_BYTES
from support.backends import STORES, TRANSPORTS, FakeClock, postgres_schema
from support.services import RABBITMQ
from support.stores import StoreFactory

TransportFactory = Callable[..., Transport]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def postgres_url(tmp_path: Path) -> str:
    """The URL of a new empty schema of the local PostgreSQL (see postgres_schema)."""
    return postgres_schema(tmp_path)


@pytest.fixture(params=sorted(STORES))
async def make_store(request: pytest.FixtureRequest,
                     tmp_path: Path) -> AsyncIterator[StoreFactory]:
    """Open store instances on this test's backing database: ``make_store(clock=...)``.

    Every call is a new instance (its own connections, as a second host would
    have) on the same data; all are closed after the test.
    """
    url = STORES[request.param](tmp_path)
    opened: list[Store] = []

    def make(clock: Callable[[], float] | None = None) -> Store:
        store = open_store(url, clock=clock)
        opened.append(store)
        return store

    yield make
    for store in opened:
        await store.close()


@pytest.fixture
def store(make_store: StoreFactory, clock: FakeClock) -> Store:
    """One store instance whose clock is the test's `clock`."""
    return make_store(clock=clock)


@pytest.fixture(params=sorted(TRANSPORTS))
async def make_transport(request: pytest.FixtureRequest) -> AsyncIterator[TransportFactory]:
    """Open transports: ``make_transport(max_message_bytes=..., **url_options)``; all
    closed afterwards. A broker's dead letters go to a place private to the test,
    emptied at its end."""
    url = TRANSPORTS[request.param]()
    private: dict[str, str] = {}
    if request.param not in ("memory", "sim"):  # (in-process: their own, in memory)
        private["dead_letters"] = f"contract.{uuid.uuid4().hex[:12]}.dead-letters"
    opened: list[Transport] = []

    def make(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, **options: str) -> Transport:
        query = urlencode({**private, **options})
        joined = url + ("&" if "?" in url else "?") + query if query else url
        transport = open_transport(joined, max_message_bytes=max_message_bytes)
        opened.append(transport)
        return transport

    yield make
    if private and opened:
        await forget_dead_letters(request.param, opened[0], private["dead_letters"])
    for transport in opened:
        await transport.close()


async def forget_dead_letters(kind: str, transport: Transport, name: str) -> None:
    """Delete a test's dead-letter queue (RabbitMQ) or stream (Redis) outright."""
    await transport.purge_dead_letters()
    if kind == "rabbitmq":
        import aio_pika

        connection = await aio_pika.connect(RABBITMQ)
        async with connection:
            channel = await connection.channel()
            await channel.queue_delete(name)
            await channel.exchange_delete(name)


@pytest.fixture
def transport(make_transport: TransportFactory) -> Transport:
    return make_transport()


@pytest.fixture
def queue_name() -> Callable[[str], str]:
    """Queue names private to this test, so a shared broker keeps no state between tests."""
    run = uuid.uuid4().hex[:12]
    return lambda label: f"contract.{run}.{label}"
