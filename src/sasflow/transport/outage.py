"""Rate-limited logging of a lost connection (SPEC R2: reconnect for as long as it
takes, with logs that stay a few lines however long that is).

A broker restart used to log a line, or a traceback, per failed call: hundreds
for a few seconds of downtime. An `Outage` logs one warning when a connection
is first lost, at most one reminder every `every` seconds while it stays lost,
and one line when it is back. `Repeats` does the same for failures that come
in numbers rather than as one outage (a hundred task drivers failing on the
same lost broker): one line per cause, then a count every `every` seconds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["Outage", "Repeats"]


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
        self.last: BaseException | None = None  # the latest failure, for errors to name

    @property
    def ongoing(self) -> bool:
        return self._since is not None

    def failed(self, error: BaseException) -> None:
        """A call failed for want of the connection."""
        now = self._clock()
        self.failures += 1
        self.last = error
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
            self.last = None


class Repeats:
    """Failures of one kind, said once per cause and then counted (R2: logs stay a few
    lines however many calls fail). A cause is the error's type and its cause's type
    (a TransportError from a refused connection), so the count is bounded by kinds,
    not by tasks or queues named in the messages."""

    def __init__(self, logger: logging.Logger, what: str, *, every: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self._what = what
        self._every = every
        self._clock = clock
        self._causes: dict[tuple[type[BaseException], type[BaseException] | None],
                           list[float]] = {}  # cause -> [when last said, count since]

    def failed(self, error: BaseException) -> None:
        cause = (type(error), type(error.__cause__) if error.__cause__ is not None else None)
        now = self._clock()
        said = self._causes.get(cause)
        if said is None:
            self._causes[cause] = [now, 0]
            self._log.error("%s: %s: %s", self._what, type(error).__name__, _one_line(error))
            # the first of each cause keeps its traceback, for whoever debugs
            self._log.debug("%s: the first %s", self._what, type(error).__name__,
                            exc_info=error)
            return
        said[1] += 1
        if now - said[0] >= self._every:
            self._log.error("%s: %d more %s in %.0fs (last: %s)", self._what, int(said[1]),
                            type(error).__name__, now - said[0], _one_line(error))
            said[0], said[1] = now, 0


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__
