"""Waking idle schedulers on PostgreSQL: whatever makes work claimable NOTIFYs in its
transaction (bulk.py's statements), delivered at commit; `listen_for_work` LISTENs."""

from __future__ import annotations

from collections.abc import Callable

import psycopg

from sasflow.store import queries
from sasflow.store.postgres.connections import Connections

__all__ = ["listen_for_work"]

_Q = queries.load("postgres", "pyformat")


async def listen_for_work(conninfo: str, db: Connections, wake: Callable[[float], None]
                          ) -> None:
    """Call `wake(at)` whenever work becomes claimable at `at`, until cancelled.

    Its own connection LISTENs for the NOTIFY that submissions and releases send
    at commit. After (re)connecting it calls `wake(now)` once, for what may have
    been missed meanwhile.
    """
    backoff = db.backoff(float("inf"))
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
                await conn.execute(_Q["listen_work"])
                backoff = db.backoff(float("inf"))
                db.outage.recovered()
                wake(db.now())
                async for notice in conn.notifies():
                    try:
                        wake(float(notice.payload))
                    except ValueError:  # not one of ours
                        wake(db.now())
        except psycopg.OperationalError as error:
            await backoff.wait(error)
