"""The blocking `submit`'s own connection to a PostgreSQL store.

Through the client's event loop, a caller submitting one task after another
waited for the loop that also runs the roles: a task's submission queued behind
the steps of the one before it (3.6 ms a submission against 1.8 ms, measured
alternately, docs/benchmarks.md). So on PostgreSQL the blocking `submit` writes
on a connection of its own, in the caller's thread, through the store's one
blocking verb: `submit_in`, joining a transaction as an application's own code
would (E1), here an autocommit one of a single statement.

Waiting out an outage stays the store's: a connection that fails is closed, and
that submission, and the next, go through the loop as `asubmit` does until a
new connection can be made.
"""

from __future__ import annotations

import threading
from typing import Any

from sasflow.store.interfaces import ClientStore
from sasflow.store.records import NewTask

__all__ = ["APPLICATION_NAME", "OwnConnection"]

# how the connection shows in pg_stat_activity, unless the URL names its connections
APPLICATION_NAME = "sasflow-submit"


class OwnConnection:
    """One autocommit connection to the store's database, for blocking submissions."""

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._conn: Any = None
        self._lock = threading.Lock()

    @classmethod
    def of(cls, store: ClientStore) -> OwnConnection | None:
        """One for `store` if it is a PostgreSQL store (it has a libpq `conninfo`)."""
        conninfo = getattr(store, "conninfo", None)
        return cls(conninfo) if isinstance(conninfo, str) else None

    def submit(self, store: ClientStore, task: NewTask) -> bool | None:
        """`store.submit_in` on this connection: whether the task was created, or None
        if the connection failed (nothing was written: submit through the loop)."""
        import psycopg  # only a PostgreSQL store has a conninfo

        with self._lock:
            try:
                if self._conn is None or self._conn.closed:
                    # the URL's application name, if it gives one, is kept
                    given = psycopg.conninfo.conninfo_to_dict(self._conninfo)
                    name = given.get("application_name", APPLICATION_NAME)
                    self._conn = psycopg.connect(self._conninfo, autocommit=True,
                                                 connect_timeout=5, application_name=name)
                return store.submit_in(self._conn, task)
            except psycopg.OperationalError:
                self._close()
                return None

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
