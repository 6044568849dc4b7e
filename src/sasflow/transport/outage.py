"""Rate-limited logging of a lost connection (SPEC R2: reconnect for as long as it
takes, with logs that stay a few lines however long that is).

A broker restart used to log a line, or a traceback, per failed call: hundreds
for a few seconds of downtime. An `Outage` logs one warning when a connection
is first lost, at most one reminder every `every` seconds while it stays lost,
and one line when it is back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["Outage"]


class Outage:
    """The state of one connection's outage, and the few lines it is worth."""

    def __init__(self, logger: logging.Logger, what: str, *, every: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self._what = what
        self._every = every
        self._clock = clock
        self._since: float | None = None  # when the outage began; None while connected
        self._said = 0.0  # when it was last logged
        self.failures = 0

    @property
    def ongoing(self) -> bool:
        return self._since is not None

    def failed(self, error: BaseException) -> None:
        """A call failed for want of the connection."""
        now = self._clock()
        self.failures += 1
        if self._since is None:
            self._since = self._said = now
            self._log.warning("%s: connection lost (%s); reconnecting", self._what,
                              _one_line(error))
        elif now - self._said >= self._every:
            self._said = now
            self._log.warning("%s: still reconnecting after %.0fs (%d attempts; %s)",
                              self._what, now - self._since, self.failures, _one_line(error))

    def recovered(self) -> None:
        """A call went through: the outage, if there was one, is over."""
        if self._since is not None:
            self._log.warning("%s: reconnected after %.1fs", self._what,
                              self._clock() - self._since)
            self._since = None
            self.failures = 0


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__
