"""State stores: SQLite (embedded default), in-memory (tests) and, with the `postgres`
extra, PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable

from sasflow.errors import ConfigurationError, MissingExtraError
from sasflow.redact import redact
from sasflow.store.interfaces import Store

__all__ = ["Store", "open_store"]


def open_store(url: str, *, clock: Callable[[], float] | None = None,
               create: bool = True, connect_within: float | None = None) -> Store:
    """The store a URL names: ``sqlite:///path``, ``postgresql://...`` or ``memory://NAME``.

    With ``create=False`` a store that does not exist yet is an error rather than
    a new empty one (for commands that only read). ``connect_within`` bounds how
    long a server store waits to be reached (an operator command answers in
    seconds; a worker, by default, waits as long as the store's own budget).
    """
    if url.startswith("sqlite:"):
        from sasflow.store.sqlite import SQLiteStore

        return SQLiteStore.from_url(url, clock=clock, create=create)
    if url.startswith(("postgresql:", "postgres:")):
        try:
            from sasflow.store.postgres import PostgresStore
        except ModuleNotFoundError as error:
            if error.name not in ("psycopg", "psycopg_pool"):
                raise
            raise MissingExtraError(
                "the PostgreSQL store needs psycopg: pip install 'sasflow[postgres]'"
            ) from error

        store = PostgresStore.from_url(url, clock=clock, create=create)
        if connect_within is not None:
            store.reconnect_for = connect_within
        return store
    if url.startswith("memory:"):
        from sasflow.store.memory import MemoryStore

        return MemoryStore.from_url(url, clock=clock, create=create)
    raise ConfigurationError(
        f"unknown store URL {redact(url)!r}: expected sqlite:///PATH, postgresql://... or"
        " memory://NAME"
    )
