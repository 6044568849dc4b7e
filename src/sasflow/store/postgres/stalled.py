"""Transactions whose client stopped: ended, so that their row locks free the others
(SPEC M3, M5: a standby takes over, and another scheduler claims, whatever froze).

A process stopped inside one of the store's transactions (SIGSTOP, a frozen VM, a
link cut mid-write) holds that transaction's row locks for as long as it stays
stopped. The lease row of a frozen supervisor leader keeps every standby from
taking over; the task rows of a frozen scheduler's claim are skipped by every
other scheduler's (`FOR UPDATE SKIP LOCKED`) and wait with it.

PostgreSQL's own bound, `idle_in_transaction_session_timeout`, does not see these
sessions. Its timer starts only when the server tells its client it is ready for
the next query (after a Sync), and the store's transactions run in pipeline mode:
psycopg asks for each result with a flush request, so between the statements of
a transaction the session is reported `active`, with no timer running, for as
long as its client stays away. Asking for results with a Sync instead would start
that timer after each answer, but not for a process stopped between two of its
own sends; PostgreSQL 17's `transaction_timeout` would bound every transaction,
a long read's too, which is no stalled writer. So the store's processes end
such sessions themselves, whatever shape the stop took:

* every pooled session waits on a lock for at most half the bound
  (`lock_timeout`): a write blocked by a stalled holder fails, and is retried as
  a conflict, instead of waiting with it;
* before a job, at most every half bound, a process ends the sessions of the
  same store (same database, role and `application_name`) that have been inside
  one transaction for longer than the bound, holding a transaction id: they wrote
  or locked rows (`SELECT ... FOR UPDATE` takes one too). A long read holds none
  and blocks no one's writes: it is left to run. A stalled transaction is then gone
  within about the bound plus a half, whoever needs its rows: a standby taking
  the lease, a scheduler claiming, a supervisor recovering.

The ended transaction rolls back; its process, once it resumes, finds its
connection gone, and what it then writes again is fenced like any late write.
The store's transactions take milliseconds; one open for the bound (10 s) is
stalled, not slow.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from sasflow.store import queries

__all__ = ["STALLED_AFTER_S", "StalledTransactions", "session_name"]

log = logging.getLogger("sasflow.store.postgres")

_Q = queries.load("postgres", "pyformat")
STALLED_AFTER_S = 10.0
_DEFAULT_NAME = "sasflow-store"
_NAME_BYTES = 63  # PostgreSQL keeps this much of an application_name (NAMEDATALEN - 1)


def session_name(conninfo: str) -> str:
    """The `application_name` of a store's pooled sessions: the URL's, marked as the
    store's, so that only the store's own sessions are ever ended (never the
    application's, under the same name, on its own connections)."""
    try:
        given = psycopg.conninfo.conninfo_to_dict(conninfo).get("application_name")
    except psycopg.ProgrammingError:  # (a bad URL: said when it is first used)
        given = None
    name = f"{given}:{_DEFAULT_NAME}" if given else _DEFAULT_NAME
    return name.encode()[:_NAME_BYTES].decode(errors="ignore")


class StalledTransactions:
    """The bounds of one store's sessions, and the ending of its stalled transactions."""

    def __init__(self, after: float = STALLED_AFTER_S) -> None:
        self.after = after  # seconds inside one transaction that make it stalled
        self._checked_at = float("-inf")  # monotonic time of the last look
        self._allowed = True  # False once the server refused to end a session

    async def bound(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Set a new pooled session's bounds (queries.sql session_bounds)."""
        await conn.execute(_Q["session_bounds"], {"bound_ms": str(round(self.after * 1000)),
                                                  "lock_wait_ms": str(round(self.after * 500))})

    def due(self) -> bool:
        return self._allowed and time.monotonic() - self._checked_at >= self.after / 2

    def look_again(self) -> None:
        """Look before the next job, however recent the last look (after a lock wait
        ran out: its holder may be stalled)."""
        self._checked_at = float("-inf")

    async def end(self, conn: psycopg.AsyncConnection[Any]) -> int:
        """End the store's sessions stalled inside a transaction (on `conn`, outside a
        transaction); how many were ended."""
        self._checked_at = time.monotonic()
        try:
            row = await (await conn.execute(_Q["end_stalled_transactions"],
                                            {"after": self.after})).fetchone()
        except pg_errors.InsufficientPrivilege as error:
            self._allowed = False
            log.warning("stalled transactions of the store cannot be ended by this role"
                        " (%s): a process stopped inside a write holds its rows until it"
                        " resumes", error)
            return 0
        ended = int(row["ended"]) if row is not None else 0
        if ended:
            log.warning("ended %d store session(s) stalled inside a transaction for over"
                        " %.0fs (a process stopped or cut off mid-write): rolled back",
                        ended, self.after)
        return ended
