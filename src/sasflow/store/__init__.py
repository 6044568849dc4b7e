"""State stores: SQLite (embedded default), in-memory (tests) and, with the `postgres`
extra, PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable

from sasflow.errors import ConfigurationError, MissingExtraError
from sasflow.store.base import Store

__all__ = ["Store", "open_store"]


def open_store(url: str, *, clock: Callable[[], float] | None = None,
               create: bool = True) -> Store:
    """The store a URL names: ``sqlite:///path``, ``postgresql://...`` or ``memory://NAME``.

    With ``create=False`` a store that does not exist yet is an error rather than
    a new empty one (for commands that only read).
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

        return PostgresStore.from_url(url, clock=clock, create=create)
    if url.startswith("memory:"):
        from sasflow.store.memory import MemoryStore

        return MemoryStore.from_url(url, clock=clock, create=create)
    raise ConfigurationError(
        f"unknown store URL {url!r}: expected sqlite:///PATH, postgresql://... or memory://NAME"
    )
