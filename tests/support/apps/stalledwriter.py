"""A process that stops itself (SIGSTOP) inside one of its store's transactions.

    python stalledwriter.py URL lease|claim

It runs one store verb on a PostgresStore at URL: `lease` renews the supervisor
lease as "frozen", `claim` claims for "frozen". Once the verb's first statement
has answered, its transaction still open with the rows it locked (the lease row,
or the claimed tasks' rows), it prints `stalled: backend PID` and stops itself:
a process frozen mid-write, exactly where the store's code stood. Once continued
(SIGCONT), it finishes the verb and prints what it got.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from typing import Any
from unittest import mock

import psycopg

from sasflow.store.postgres import PostgresStore
from support.stores import PLANS

# the verb's first statement, by a piece of its text (queries.sql)
STATEMENTS = {"lease": "INSERT INTO leases", "claim": "FOR UPDATE SKIP LOCKED"}


def stop_after(piece: str) -> contextlib.ExitStack:
    """Once a statement holding `piece` has answered, stop this process (once): psycopg's
    cursor patched while the returned stack is open."""
    execute, fetchall = psycopg.AsyncCursor.execute, psycopg.AsyncCursor.fetchall
    texts: dict[int, str] = {}
    stopped: list[bool] = []

    async def remembered(self: psycopg.AsyncCursor[Any], query: Any, *args: Any,
                         **kwargs: Any) -> Any:
        texts[id(self)] = str(query)
        return await execute(self, query, *args, **kwargs)

    async def answered(self: psycopg.AsyncCursor[Any]) -> Any:
        rows = await fetchall(self)
        if piece in texts.pop(id(self), "") and not stopped:
            stopped.append(True)
            print(f"stalled: backend {self.connection.info.backend_pid}", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        return rows

    patches = contextlib.ExitStack()
    patches.enter_context(mock.patch.object(psycopg.AsyncCursor, "execute", remembered))
    patches.enter_context(mock.patch.object(psycopg.AsyncCursor, "fetchall", answered))
    return patches


async def main(url: str, verb: str) -> None:
    store = PostgresStore(url)
    with stop_after(STATEMENTS[verb]):
        await run(store, verb)


async def run(store: PostgresStore, verb: str) -> None:
    try:
        if verb == "lease":
            print(f"lease: {await store.acquire_lease('supervisor', 'frozen', 60.0)}",
                  flush=True)
        else:
            claimed = await store.claim("frozen", 10, PLANS)
            print(f"claimed: {sorted(task.task_id for task in claimed)}", flush=True)
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
