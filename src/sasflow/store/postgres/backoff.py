"""Waiting out a PostgreSQL outage, or another session's long lock: growing waits
within a budget, each failed attempt told to the store's Outage, which decides
whether to log it (R2)."""

from __future__ import annotations

import asyncio
import random
import time

from sasflow.errors import StoreError
from sasflow.outage import Outage

__all__ = ["POOL_WAIT_MAX_S", "Backoff"]

_BACKOFF_MAX_S = 1.0
# One wait for a pooled connection. Short, so that a caller asks again (and the
# pool tries to connect again) soon after the database is back.
POOL_WAIT_MAX_S = 5.0


class Backoff:
    """Waits growing from 50 ms to 1 s, for at most `budget` seconds in all."""

    def __init__(self, budget: float, outage: Outage) -> None:
        self._outage = outage
        self._deadline = time.monotonic() + budget
        self._delay = 0.05
        self._error: Exception | None = None  # the last cause, for the final error

    def note(self, error: Exception) -> None:
        self._error = error

    def patience(self) -> float:
        """How long one wait for a connection may last: what is left of the budget."""
        return min(max(self._deadline - time.monotonic(), 0.05), POOL_WAIT_MAX_S)

    async def wait_for_lock(self, error: Exception) -> None:
        """A statement's wait for another session's lock ran out (lock_timeout): it
        waited already, so it goes again at once, within the same budget."""
        self._error = error
        if time.monotonic() >= self._deadline:
            raise StoreError("the PostgreSQL store waited too long for a lock another"
                             f" session holds: {error}") from error
        await asyncio.sleep(random.uniform(0.001, 0.01))

    async def wait(self, error: Exception | None) -> None:
        self._error = error or self._error
        if time.monotonic() >= self._deadline:
            raise StoreError(f"the PostgreSQL store stayed unreachable: {self._error}"
                             ) from self._error
        if error is not None:
            self._outage.failed(error)
        await asyncio.sleep(random.uniform(0.5, 1.0) * self._delay)
        self._delay = min(self._delay * 2, _BACKOFF_MAX_S)
