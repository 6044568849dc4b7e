"""Fixtures of the scenario tests: private servers (servers.py) and the flaky remote.

One private PostgreSQL cluster serves the whole session (initdb costs seconds);
each test gets a database of its own in it. Each test gets a broker of its own
(a RabbitMQ node or a redis-server), which it may crash and restart at will.

The servers start lazily, from function-scoped fixtures, so the root conftest's
check (skip on a laptop without the servers, fail in CI) runs first.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from scenarioapp import STEP_TIMEOUT

from sasflow.examples.orders.remote import Faults, RemoteService
from support.matrix import BACKENDS, Backend
from support.scenario import Broker, Postgres
from support.servers import PrivatePostgres, PrivateRabbit, PrivateRedis

# The remote fails often, and in every way a caller cannot tell from a success:
# lost and late replies (the latter after the step's complete-by) leave an effect
# applied that only the idempotency key keeps from being applied again.
FAULTS = Faults(transient=0.08, slow=0.02, slow_s=STEP_TIMEOUT + 0.5, lost=0.02, seed=2025)


LONG_ENV = "SASFLOW_LONG"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave the long variants out unless SASFLOW_LONG=1 (docs/reliability.md)."""
    if os.environ.get(LONG_ENV) == "1":
        return
    long = [item for item in items if item.get_closest_marker("long")]
    if long:
        config.hook.pytest_deselected(items=long)
        items[:] = [item for item in items if not item.get_closest_marker("long")]


class _Session:
    """The session's private PostgreSQL, started on first use."""

    def __init__(self) -> None:
        self.postgres: PrivatePostgres | None = None

    def get_postgres(self) -> PrivatePostgres:
        if self.postgres is None:
            self.postgres = PrivatePostgres().start()
        return self.postgres

    def close(self) -> None:
        if self.postgres is not None:
            self.postgres.close()


@pytest.fixture(scope="session")
def _private_servers() -> Iterator[_Session]:
    session = _Session()
    try:
        yield session
    finally:
        session.close()


@pytest.fixture
def postgres(_private_servers: _Session, request: pytest.FixtureRequest) -> Postgres:
    """A fresh database in the private cluster; it is started again if a test left it down."""
    server = _private_servers.get_postgres()
    if not server.running():
        server.start()
    case = request.node.callspec.id if hasattr(request.node, "callspec") else "test"
    name = re.sub(r"[^a-z0-9]+", "_", f"{request.node.originalname}_{case}".lower())[-60:]
    return Postgres(server, server.create_database(name))


@contextlib.contextmanager
def private_broker(kind: str, root: Path) -> Iterator[Broker]:
    """A private broker of `kind` (rabbitmq, redis, redis-volatile), closed afterwards."""
    server: PrivateRabbit | PrivateRedis
    if kind == "rabbitmq":
        server = PrivateRabbit(root / "rabbitmq")
        url = server.url
    else:
        server = PrivateRedis(root / "redis", persistent=kind == "redis")
        # a dead agent's unacked requests are taken over after 5 s, not the default 30
        url = f"{server.url}?prefix=scenario:&visibility_timeout=5"
    try:
        server.start()
        yield Broker(kind, server, url)
    finally:
        server.close()


@pytest.fixture(params=["rabbitmq", "redis", "redis-volatile"])
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Broker]:
    """A private broker. ``redis`` keeps an fsynced append-only file, so a restart loses
    nothing acknowledged (like RabbitMQ's durable queues); ``redis-volatile`` keeps
    nothing, so its restart loses every queued request and reply, and only the
    supervisors' expiry of the steps concerned brings them back."""
    with private_broker(request.param, tmp_path) as found:
        yield found


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """The fault matrix's backends: SQLite (in-process transport), or the private
    PostgreSQL with the in-process transport, a private RabbitMQ or a private Redis."""
    name: str = request.param
    if name == "sqlite":
        yield Backend(name, f"sqlite:///{tmp_path / 'store.db'}", None, None)
        return
    database: Postgres = request.getfixturevalue("postgres")
    kind = name.removeprefix("postgres-")
    if kind == "memory":
        yield Backend(name, database.url, database, None)
        return
    with private_broker(kind, tmp_path) as found:
        yield Backend(name, database.url, database, found)


@pytest.fixture
def remote() -> Iterator[RemoteService]:
    with RemoteService(faults=FAULTS) as service:
        yield service
