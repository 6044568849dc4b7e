"""Reading the outbox (E11) when the store says status messages were written.

A status message is written in the transaction of the change it reports
(DESIGN invariant 7). A worker's relay (worker.py) publishes them to the queues
applications named, and a status stream on in-process queues (status_stream.py)
reads its own queue's. Both used to take the outbox every 20-50 ms, whether or
not anything was there, and taking is a write: an idle `sasflow worker` on
PostgreSQL committed 20 transactions a second, and each take held the event
loop about a millisecond, in the way of whatever step's message came then
(docs/benchmarks.md). Now a reader waits for the store's word
(`RelayStore.watch_outbox`: a NOTIFY on PostgreSQL, the wake-up sockets on
SQLite, a callback in memory), and still looks every `LOOK_S`: for messages
whose reader died holding them (their lease ended), for a submission committed
in the caller's own SQLite transaction (E1), and for a word that was lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from types import TracebackType

from sasflow.store.interfaces import RelayStore

__all__ = ["LOOK_S", "OutboxWatch"]

log = logging.getLogger("sasflow.outbox")

# How long a reader waits, when no word comes, before it takes the outbox anyway.
LOOK_S = 1.0


class OutboxWatch:
    """`async with OutboxWatch(store) as outbox:` then, between takes, `await
    outbox.written()`: back as soon as a commit may have written status messages
    since the last return (or at once, the first time), or after `look` seconds."""

    def __init__(self, store: RelayStore, *, look: float | None = None) -> None:
        self._store = store
        self._look = look
        self._word = asyncio.Event()
        self._watching: asyncio.Task[None] | None = None

    async def __aenter__(self) -> OutboxWatch:
        self._watching = asyncio.create_task(self._store.watch_outbox(self._word.set),
                                             name="sasflow-outbox-watch")
        self._watching.add_done_callback(_log_end)
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        trace: TracebackType | None) -> None:
        if self._watching is not None:
            self._watching.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watching

    async def written(self) -> None:
        """Wait for the word, or the look. The word is cleared as this returns, before
        the caller takes again: one that comes during the take is kept for the next
        wait, so no commit goes unread until the look."""
        look = LOOK_S if self._look is None else self._look
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(look):
                await self._word.wait()
        self._word.clear()


def _log_end(watching: asyncio.Task[None]) -> None:
    if not watching.cancelled() and watching.exception() is not None:
        log.warning("no longer told when status messages are written (%r); reading the"
                    " outbox every %gs", watching.exception(), LOOK_S)
