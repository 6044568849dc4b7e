"""Rate-limited reporting of a connection that is down (R2).

A client that reopens a lost connection with backoff, for as long as it takes,
must not log every attempt: a store down for ten minutes would write thousands
of lines. An OutageLog says one line when the connection goes down, one every
`every` seconds while it stays down (with how long so far), and one when it is
back, whatever the number of attempts or of callers in between.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["OutageLog"]


class OutageLog:
    """The log lines of one connection's outages; safe to share between threads."""

    def __init__(self, log: logging.Logger, what: str, *, every: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log = log
        self.what = what  # e.g. "the PostgreSQL store"
        self.every = every
        self.clock = clock
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._said_at = 0.0

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def failed(self, error: BaseException | str | None) -> None:
        """An attempt failed: say so if it is the first, or if `every` seconds passed."""
        now = self.clock()
        with self._lock:
            if self._down_since is None:
                self._down_since = self._said_at = now
                first = True
            elif now - self._said_at >= self.every:
                self._said_at = now
                first = False
            else:
                return
            since = self._down_since
        if first:
            self.log.warning("%s is unreachable (%s); retrying until it is back", self.what,
                             _one_line(error))
        else:
            self.log.warning("%s still unreachable after %.0fs (%s); retrying", self.what,
                             now - since, _one_line(error))

    def succeeded(self) -> None:
        """An attempt worked: say so once if the connection was down."""
        if self._down_since is None:  # the common case: no lock
            return
        with self._lock:
            since, self._down_since = self._down_since, None
        if since is not None:
            self.log.info("%s is reachable again after %.1fs", self.what,
                             self.clock() - since)


def _one_line(error: BaseException | str | None) -> str:
    text = str(error or "no answer").strip()
    return " ".join(text.split()) or type(error).__name__
