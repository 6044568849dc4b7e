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
new connection can be made. So does the store's first use, its schema check (on
a connection of its own, which may be lost too): until the store has made it,
submissions go through the loop, whose opening of the store waits out a lost
connection; made here, its failure reached the caller as an error.

A server that stops answering fails the connection too: its answers are waited
for the store's `answer_within` seconds (silent.py), as the loop's calls wait.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Literal, Protocol, TypeVar, cast

from sasflow.model import Task
from sasflow.store.interfaces import ClaimRule, ClientStore
from sasflow.store.records import NewTask

T = TypeVar("T")

__all__ = ["APPLICATION_NAME", "OwnConnection"]

# how the connection shows in pg_stat_activity, unless the URL names its connections
APPLICATION_NAME = "sasflow-submit"


class _Joinable(Protocol):
    """A store whose submissions can join a caller's connection (PostgreSQL's)."""

    conninfo: str

    @property
    def answer_within(self) -> float: ...

    @property
    def schema_checked(self) -> bool: ...

    def submit_in(self, connection: Any, task: NewTask) -> bool: ...

    def submit_claimed_in(self, connection: Any, task: NewTask, owner: str, rule: ClaimRule
                          ) -> Task | None: ...


class OwnConnection:
    """One autocommit connection to the store's database, for blocking submissions."""

    def __init__(self, store: _Joinable) -> None:
        self._store = store
        self._conninfo = store.conninfo
        self._conn: Any = None
        self._lock = threading.Lock()

    @classmethod
    def of(cls, store: ClientStore) -> OwnConnection | None:
        """One for `store` if it is a PostgreSQL store (it has a libpq `conninfo`)."""
        conninfo = getattr(store, "conninfo", None)
        return cls(cast(_Joinable, store)) if isinstance(conninfo, str) else None

    def submit(self, task: NewTask) -> bool | None:
        """`submit_in` on this connection: whether the task was created, or None if the
        connection failed or the store has not checked its schema yet (nothing was
        written: submit through the loop)."""
        return self._run(lambda conn: self._store.submit_in(conn, task))

    def submit_claimed(self, task: NewTask, owner: str, rule: ClaimRule
                       ) -> Task | Literal[False] | None:
        """The task written as claimed for `owner` (a scheduler of this process) by
        `rule`, in one statement on this connection: the task as claimed, False if it
        existed (nothing written), or None as for `submit`."""
        return self._run(
            lambda conn: self._store.submit_claimed_in(conn, task, owner, rule) or False)

    def _run(self, write: Callable[[Any], T]) -> T | None:
        import psycopg  # only a PostgreSQL store has a conninfo

        from sasflow.store.postgres.silent import AnsweredSync

        if not self._store.schema_checked:
            return None
        with self._lock:
            try:
                if self._conn is None or self._conn.closed:
                    # the URL's application name, if it gives one, is kept
                    given = psycopg.conninfo.conninfo_to_dict(self._conninfo)
                    name = given.get("application_name", APPLICATION_NAME)
                    self._conn = psycopg.connect(self._conninfo, autocommit=True,
                                                 connect_timeout=5, application_name=name)
                with AnsweredSync(self._conn, self._store.answer_within):
                    return write(self._conn)
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
