"""The contract suites' backends: every store and every transport, one entry each.

A backend joins a suite by adding one entry to STORES or TRANSPORTS: a function
that prepares an empty, private place for one test (a database file, a
database, a key prefix) and returns the URL to reach it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

from support.services import POSTGRES, RABBITMQ, REDIS, require

START = 1_700_000_000.0


class FakeClock:
    """The store's clock, moved by the test: expiry and leases without sleeping."""

    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def postgres_schema(tmp_path: Path) -> str:
    """A new empty schema in the local server's `test` database, dropped at exit.

    A schema (not a database) per test: creating one costs a millisecond, and the
    store's migrations fill it through the URL's search_path. The name carries the
    process id, so schemas left by a killed run are dropped by the next one.
    """
    import atexit
    import os

    import psycopg

    require("postgres")
    name = f"contract_{os.getpid()}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES, autocommit=True) as conn:
        for (old,) in conn.execute("SELECT nspname FROM pg_namespace"
                                   " WHERE nspname ~ '^contract_[0-9]+_'").fetchall():
            if not os.path.exists(f"/proc/{old.split('_')[1]}"):  # its run is gone
                conn.execute(f"DROP SCHEMA IF EXISTS {old} CASCADE")
        conn.execute(f"CREATE SCHEMA {name}")

    def drop() -> None:
        with psycopg.connect(POSTGRES, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")

    atexit.register(drop)
    return f"{POSTGRES}?options=-csearch_path%3D{name}"


# backend name -> prepares an empty store for one test and returns its URL
STORES: dict[str, Callable[[Path], str]] = {
    "postgres": postgres_schema,
    "sqlite": lambda tmp_path: f"sqlite:///{tmp_path / 'contract.db'}",
    # the simulation's store: named per test, shared by the stores opened on that name
    "memory": lambda tmp_path: f"memory://contract-{uuid.uuid4().hex}",
}

def redis_transport() -> str:
    # a database apart from the default one; queue names are unique per test
    require("redis")
    return f"{REDIS}?prefix=sasflow-contract:"


def rabbitmq_transport() -> str:
    # queues the broker deletes once unused for a while, so no test leaves any behind
    require("rabbitmq")
    return f"{RABBITMQ}?queue_expires=20"


# backend name -> the URL of a transport for one test (queue names are made unique)
TRANSPORTS: dict[str, Callable[[], str]] = {
    "memory": lambda: "memory",
    # the simulation's broker (sasflow.testing), faults off: a plain broker with acks
    "sim": lambda: "sim",
    "redis": redis_transport,
    "rabbitmq": rabbitmq_transport,
}


def app_transport(kind: str, run: str) -> str:
    """The URL of a transport for one App of one test, private to `run`: its Redis keys
    under a prefix of its own, its RabbitMQ dead letters in an exchange and queue of
    their own (`dead_letter_name(run)`, for the test to delete)."""
    if kind == "memory":
        return "memory"
    if kind == "redis":
        require("redis")
        return f"{REDIS}?prefix=sasflow-{run}:"
    require("rabbitmq")
    return f"{RABBITMQ}?queue_expires=20&dead_letters={dead_letter_name(run)}"


def dead_letter_name(run: str) -> str:
    return f"{run}.dead-letters"


APP_TRANSPORTS = ("memory", "rabbitmq", "redis")
