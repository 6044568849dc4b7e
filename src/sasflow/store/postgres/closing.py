"""The pool closed with its home loop, whoever forgets to close it.

psycopg_pool runs its maintenance (connecting, checking and returning
connections) in worker tasks on the pool's loop, and a worker cancelled in the
middle of such a task goes on, to keep the pool whole: only the pool's close ends
it. A loop that ends its tasks with the pool still open (`asyncio.run` returning,
a test's loop torn down, before or without the application's `close`) cancels
them all and waits for them, and so waited for ever on a worker that had been
connecting or returning a connection at that moment (seen in CI: an async test's
teardown, waiting on an open pool).

So beside each open pool a task of its own waits, on the same loop, for nothing
but its cancellation: the loop's end cancels it with the workers, and it closes
the pool, which stops them. The store's own close goes through it too.
"""

from __future__ import annotations

import asyncio
import contextlib

from psycopg_pool import AsyncConnectionPool

__all__ = ["PoolCloser", "close_pool", "close_there"]


class PoolCloser:
    """Closes `pool` when its loop ends its tasks, or when told (on that loop)."""

    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool
        self._watch = asyncio.get_running_loop().create_task(
            self._until_cancelled(), name=f"{pool.name}-closer")

    async def _until_cancelled(self) -> None:
        try:
            await asyncio.get_running_loop().create_future()  # (never set)
        finally:
            await self.pool.close()

    async def close(self) -> None:
        """Close the pool now (on its loop)."""
        self._watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._watch


async def close_pool(pool: AsyncConnectionPool, closer: PoolCloser | None) -> None:
    """Close `pool` (on its loop): through `closer` if it is the pool's, which then ends
    too, else directly (a pool never opened has none)."""
    if closer is not None and closer.pool is pool:
        await closer.close()
    else:
        await pool.close()


_closing: set[asyncio.Task[None]] = set()  # pools being closed on their idle home loop


def close_there(closer: PoolCloser) -> None:
    """In the pool's home loop, once it runs again: the pool closed."""
    closing = asyncio.get_running_loop().create_task(closer.close())
    _closing.add(closing)
    closing.add_done_callback(_closing.discard)
