"""A server that stops answering: a store call given up after a bound, as if its
connection had broken.

A PostgreSQL server can stop answering while its connections stay up: a hung host,
a link or a firewall that drops every packet, a failover that left the old address
silent. A statement in flight then waits for as long as TCP keeps resending (about
a quarter of an hour), or for ever while something still acknowledges the packets,
and with it the role that made the call: a scheduler's step, a supervisor's sweep,
a heartbeat.

So every job of the store (`Connections.run`) gets its answers within
`answer_within` seconds (ANSWER_WITHIN_S by default), or its connection is given up
as lost: psycopg, cancelled, asks the server to cancel the statement (up to 5 s for
the request, 5 s for its answer) and closes the connection if it hears nothing, and
the job fails with psycopg.OperationalError, as for a connection that broke. It is
then waited out within `reconnect_for`, and a write whose answer never came is
looked up by its token once the server answers again (bulk.py). The bound is far
above any statement of the store's: a lock wait is 5 s at most (stalled.py).
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any

import psycopg

__all__ = ["ANSWER_WITHIN_S", "Answered"]

ANSWER_WITHIN_S = 30.0


class Answered:
    """asyncio.timeout around a job on `conn`, its expiry turned into a lost connection
    (a class, not a generator: it wraps every job, and costs half as much so)."""

    __slots__ = ("_conn", "_seconds", "_timeout")

    def __init__(self, conn: psycopg.AsyncConnection[Any], seconds: float) -> None:
        self._conn = conn
        self._seconds = seconds
        self._timeout = asyncio.timeout(seconds)

    async def __aenter__(self) -> None:
        await self._timeout.__aenter__()

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        trace: TracebackType | None) -> None:
        try:
            await self._timeout.__aexit__(kind, error, trace)
        except TimeoutError as timed_out:
            await self._conn.close()
            raise psycopg.OperationalError(
                f"no answer from the database within {self._seconds:g}s") from timed_out
